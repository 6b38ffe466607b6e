"""The engine process dies: a streaming request ends with an error instead of hanging, /health answers 503,
and new requests fail with 503 at once."""

import json
import os
import signal
import time
from pathlib import Path

import httpx


def engine_pid(server_pid: int) -> int:
    """The spawned engine process (the server's other child is multiprocessing's resource tracker)."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    (engine,) = [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    return int(engine)


def test_engine_death_is_503_not_a_hang(launch_server):
    proc, url = launch_server()
    body = {"prompt": "Hello", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as resp:
        lines = (line for line in resp.iter_lines() if line.startswith("data: "))
        assert json.loads(next(lines)[6:])["choices"]
        os.kill(engine_pid(proc.pid), signal.SIGKILL)
        rest = list(lines)  # must end, not hang
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["error"]["code"] == 503
    deadline = time.monotonic() + 10
    while httpx.get(f"{url}/health").status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    resp = httpx.post(f"{url}/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=10)
    assert resp.status_code == 503 and resp.json()["error"]["type"] == "ServiceUnavailableError"
