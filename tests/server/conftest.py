"""One real server for the module's tests: `python -m qwen3_runtime serve` on configs/tiny.yaml (CPU, random
weights, the built-in tokenizer) on a free port of 127.0.0.1, with an API key."""

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import httpx
import pytest

API_KEY = "test-key"
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, log, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the server did not become healthy")


def start_server(*extra: str, log: IO[str] | None = None) -> tuple[subprocess.Popen, str]:
    """log: where its output goes (a temporary file by default)."""
    port = free_port()
    # The server runs the kernels' PyTorch references on the CPU, as the offline runtime of the tests does
    # (tests/conftest.py sets TRITON_INTERPRET for the kernel tests; the child must not inherit it).
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "qwen3_runtime", "serve", "--config", "tiny", "--port", str(port), *extra]
    # Its output goes to a file: a pipe nobody reads would fill up and block the server.
    log = log or tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
    except BaseException:
        proc.kill()
        raise
    return proc, url


@pytest.fixture(scope="session")
def server():
    """(process, base url) of a server that requires API_KEY."""
    proc, url = start_server("--api-key", API_KEY)
    yield proc, url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def base_url(server) -> str:
    return server[1]


@pytest.fixture(scope="session")
def client(base_url):
    import openai

    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def http(base_url):
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def api_key() -> str:
    return API_KEY


@pytest.fixture(scope="session")
def metric(http):
    """metric(name) -> a sample's value from /metrics (0 when absent)."""

    def read(name: str) -> float:
        for line in http.get("/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    return read


@pytest.fixture(scope="module")
def make_runtime_module():
    """The offline Runtime on the server's config, with the kernels' PyTorch references (as the server runs)."""
    from qwen3_runtime import Runtime, ops

    saved, ops.TRITON_INTERPRET = ops.TRITON_INTERPRET, False
    try:
        yield Runtime.from_yaml("tiny")
    finally:
        ops.TRITON_INTERPRET = saved


@pytest.fixture(scope="session")
def launch_server():
    """launch_server(*args) -> (process, url) of a server of its own, stopped at the end of the session."""
    started = []

    def launch(*extra: str, log: IO[str] | None = None) -> tuple[subprocess.Popen, str]:
        proc, url = start_server(*extra, log=log)
        started.append(proc)
        return proc, url

    yield launch
    for proc in started:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def replay():
    """replay(tok, out, ids, splits, stops=(), finish="stop") -> (whole MessageDelta, streamed delta fields): one
    choice's tokens as the server reads them (updates cut at `splits`, Choice.delta after each) through the
    ChatOutput `out`."""
    from qwen3_runtime.request import RequestUpdate
    from qwen3_runtime.server.chat_output import MessageDelta
    from qwen3_runtime.server.choice import Choice, TextOptions

    def run(tok, out, ids, splits, stops=(), finish="stop"):
        choice = Choice(0, tok, TextOptions(list(stops)))
        whole, chunks = MessageDelta(), []
        bounds = [0, *(s for s in splits if 0 < s < len(ids)), len(ids)]
        for a, b in zip(bounds, bounds[1:]):
            choice.apply(RequestUpdate("r", ids[a:b], None, None, finish if b == len(ids) else None, None, 3))
            text, token_ids, _, offsets = choice.delta()
            delta = out.delta(text, token_ids, offsets, choice.finished)
            chunks.append(delta.stream_fields())
            whole.extend(delta)
        return whole, chunks

    return run
