"""`qwen3-runtime serve` with a bad config, address or flag: `error: ...` and exit 2, before any process is spawned."""

import socket

import pytest

from qwen3_runtime.cli import main


def test_bad_config_exits_2(capsys):
    assert main(["serve", "--config", "no-such-config"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert main(["serve", "--set", "engine.max_model_len=-3"]) == 2
    assert "max_model_len" in capsys.readouterr().err


def test_an_address_it_cannot_listen_on_exits_2_before_the_engine_starts(capsys, monkeypatch):
    from qwen3_runtime.server import launch

    monkeypatch.setattr(launch.EngineClient, "start", lambda self: pytest.fail("the engine started"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    assert capsys.readouterr().err == f"error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert main(["serve", "--host", "no-such-host.invalid"]) == 2
    assert capsys.readouterr().err.startswith("error: cannot listen on no-such-host.invalid:8000: ")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--port", "65536"], "argument --port: 65536 is out of range: must be in [0, 65535]"),
        (["--port", "x"], "argument --port: 'x' is not an integer"),
        (["--max-request-bytes", "0"], "argument --max-request-bytes: 0 is out of range: must be >= 1"),
        (["--max-choices-per-request", "0"], "argument --max-choices-per-request: 0 is out of range: must be >= 1"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", *args])
    assert exit_.value.code == 2 and capsys.readouterr().err.rstrip().endswith(f"error: {message}")
