"""The engine process dies (kill -9): the requests in flight, streamed or not, end with a 503 instead of hanging,
and the server stops and exits 1, its log naming the signal, so that a supervisor restarts it (as vLLM's)."""

import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx

from qwen3_runtime.server.engine_client import describe_exit

RUNNING = ("qwen3_runtime_num_requests_running", "qwen3_runtime_num_requests_waiting")
LONG = {"prompt": "Hello", "max_tokens": 200, "ignore_eos": True}


def engine_pid(server_pid: int) -> int:
    """The spawned engine process (the server's other child is multiprocessing's resource tracker)."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    (engine,) = [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    return int(engine)


def engine_requests(url: str) -> float:
    """The requests the engine holds, running or waiting, by /metrics."""
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    return sum(float(line.split()[1]) for line in lines if line.split(" ")[0] in RUNNING)


def test_engine_death_fails_the_requests_in_flight_and_stops_the_server(launch_server):
    log = tempfile.TemporaryFile("w+")
    proc, url = launch_server(log=log)
    whole: list[httpx.Response] = []
    post = threading.Thread(target=lambda: whole.append(httpx.post(f"{url}/v1/completions", json=LONG, timeout=60)))
    post.start()
    with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}, timeout=60) as resp:
        lines = (line for line in resp.iter_lines() if line.startswith("data: "))
        assert json.loads(next(lines)[6:])["choices"]
        deadline = time.monotonic() + 30
        while engine_requests(url) < 2:  # the response that is not streamed is under way too
            assert time.monotonic() < deadline and post.is_alive()
            time.sleep(0.1)
        os.kill(engine_pid(proc.pid), signal.SIGKILL)
        rest = list(lines)  # must end, not hang
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["error"]["code"] == 503
    post.join(timeout=30)
    assert whole[0].status_code == 503 and whole[0].json()["error"]["type"] == "ServiceUnavailableError"
    assert proc.wait(timeout=15) == 1
    log.seek(0)
    output = log.read()
    assert "the engine process died (killed by SIGKILL, exit code -9): its requests fail" in output, output
    assert "\nerror: the engine process died (killed by SIGKILL, exit code -9): the server stopped\n" in output, output
    assert "Traceback" not in output, output


def test_an_exit_status_in_words():
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-signal.SIGSEGV) == "killed by SIGSEGV, exit code -11"
    assert describe_exit(-99) == "killed by signal 99, exit code -99"
