"""Stopping `serve`: SIGTERM (to the server, or to its whole process group as a service manager sends it) or a
terminal's Ctrl+C (SIGINT to the whole process group, the engine included) shuts the server down in order and prints
no traceback and no leak report."""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.server.conftest import ROOT, free_port, wait_healthy


def group_ends(pgid: int, timeout: float = 10.0) -> bool:
    """Whether every process of the group has exited (and been reaped) within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize(
    ("sig", "group", "returncode"),
    [
        (signal.SIGTERM, False, -signal.SIGTERM),  # uvicorn re-raises the signal once it has shut down
        (signal.SIGTERM, True, -signal.SIGTERM),  # a service manager's stop: the engine included
        (signal.SIGINT, True, 130),
    ],
    ids=["sigterm", "sigterm-group", "ctrl-c"],
)
def test_a_signal_stops_the_server_quietly(sig, group, returncode):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "qwen3_runtime", "serve", "--config", "tiny", "--port", str(port)]
    with tempfile.TemporaryFile("w+") as log:
        # A session of its own: the group's Ctrl+C must not reach pytest.
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", proc, log)
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
            assert proc.wait(timeout=60) == returncode
            assert group_ends(proc.pid), "a process of the server's (its engine?) outlived it"
        finally:  # whatever the test found, nothing of the server's outlives it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.seek(0)
        output = log.read()
    assert "Finished server process" in output
    assert "leaked" not in output and "Traceback" not in output, output
