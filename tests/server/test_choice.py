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


def _byte_tokens(tok, text: str) -> list[int]:
    """`text` as one single-byte token per UTF-8 byte: a character's first tokens complete no text."""
    single = {tok.token_bytes(i): i for i in range(512) if len(tok.token_bytes(i)) == 1}
    return [single[bytes([b])] for b in text.encode()]


def test_without_stops_each_token_goes_out_before_its_character_completes(tok):
    ids = _byte_tokens(tok, "a🙂")
    choice = Choice(0, tok, [])
    deltas = []
    for t in ids:
        choice.apply(update([t]))
        deltas.append(choice.delta())
    assert [d[1] for d in deltas] == [[t] for t in ids]  # a delta per token, as vLLM streams them
    assert [d[0] for d in deltas] == ["a", "", "", "", "🙂"]
    assert [d[3] for d in deltas] == [[0], [1], [1], [1], [1]]  # each at its character's start


def test_with_stops_a_token_waits_for_its_text(tok):
    """A stop string may still cut what an incomplete character's tokens would complete, so they wait."""
    ids = _byte_tokens(tok, "a🙂")
    choice = Choice(0, tok, ["x"])
    deltas = []
    for t in ids:
        choice.apply(update([t]))
        deltas.append(choice.delta())
    assert [d[1] for d in deltas] == [ids[:1], [], [], [], ids[1:]]
    assert "".join(d[0] for d in deltas) == "a🙂"

    cut = Choice(0, tok, ["🙂"])  # the completing token makes the stop: none of the character's tokens goes out
    for t in ids:
        cut.apply(update([t]))
        text, kept, _, _ = cut.delta()
        assert kept == ([] if t != ids[0] else ids[:1]) and text == ("a" if t == ids[0] else "")
    assert cut.finish_reason == "stop"
