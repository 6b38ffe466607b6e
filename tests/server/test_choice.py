"""Choice: incremental text, stop strings cut the output (also across tokens), held-back text while streaming."""

import pytest

from qwen3_runtime.request import RequestUpdate
from qwen3_runtime.server.choice import Choice
from qwen3_runtime.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.builtin_qwen3()


def update(ids, finish=None):
    return RequestUpdate("r", list(ids), None, None, finish, None, 3)


def test_stop_string_across_tokens_cuts_and_holds_back(tok):
    ids = tok.encode("Hello world, stop here please")
    choice = Choice(0, tok, ["stop here"])
    sent = ""
    for t in ids:
        stopped = choice.apply(update([t]))
        sent += choice.delta()[0]
        if stopped:
            break
    assert choice.finish_reason == "stop" and stopped
    assert sent == "Hello world, "
    assert choice.apply(update([], "abort")) is False  # the engine's abort after the stop changes nothing
    assert choice.finish_reason == "stop"


def test_no_stop_streams_everything(tok):
    ids = tok.encode("héllo 🙂 wörld")
    choice = Choice(0, tok, [])
    pieces = []
    for t in ids[:-1]:
        choice.apply(update([t]))
        pieces.append(choice.delta())
    choice.apply(update(ids[-1:], "length"))
    pieces.append(choice.delta())
    assert "".join(p[0] for p in pieces) == "héllo 🙂 wörld"
    assert [t for p in pieces for t in p[1]] == ids
    assert choice.finish_reason == "length"


def test_tokens_after_the_stop_are_dropped(tok):
    ids = tok.encode("a b c d")
    choice = Choice(0, tok, [" c"])
    assert choice.apply(update(ids, "length"))
    text, kept, _, offsets = choice.delta()
    assert text == "a b" and tok.decode(kept) == "a b" and offsets == [0, 1][: len(kept)]
