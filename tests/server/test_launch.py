"""`qwen3-runtime serve` with a bad config: `error: ...` and exit 2, before any process is spawned."""

from qwen3_runtime.cli import main


def test_bad_config_exits_2(capsys):
    assert main(["serve", "--config", "no-such-config"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert main(["serve", "--set", "engine.max_model_len=-3"]) == 2
    assert "max_model_len" in capsys.readouterr().err
