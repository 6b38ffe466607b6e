"""Choice: incremental text, stop strings cut the output (also across tokens), held-back text while streaming, the
stop token and special tokens without text."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwen3_runtime.request import RequestUpdate
from qwen3_runtime.server.choice import Choice, TextOptions
from qwen3_runtime.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.builtin_qwen3()


def update(ids, finish=None):
    return RequestUpdate("r", list(ids), None, None, finish, None, 3)


def test_stop_string_across_tokens_cuts_and_holds_back(tok):
    ids = tok.encode("Hello world, stop here please")
    choice = Choice(0, tok, TextOptions(["stop here"]))
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
    choice = Choice(0, tok, TextOptions([]))
    pieces = []
    for t in ids[:-1]:
        choice.apply(update([t]))
        pieces.append(choice.delta())
    choice.apply(update(ids[-1:], "length"))
    pieces.append(choice.delta())
    assert "".join(p[0] for p in pieces) == "héllo 🙂 wörld"
    assert [t for p in pieces for t in p[1]] == ids
    assert choice.finish_reason == "length"


def test_every_token_received_keeps_its_place_after_the_cut(tok):
    """As usage counts them: the tokens whose text a stop string cut still come with their logprobs (vLLM's)."""
    ids = tok.encode("a b c d")
    choice = Choice(0, tok, TextOptions([" c"]))
    assert choice.apply(update(ids, "length"))
    text, kept, _, offsets = choice.delta()
    assert text == "a b" and kept == ids and offsets == [0, 1, 3, 5]
    assert choice.apply(update(tok.encode(" e"))) is False and choice.delta()[1] == []  # after the abort: dropped


def test_the_stop_token_and_special_tokens_have_no_text(tok):
    """EOS (special) and a stop token (one of stop_token_ids, not special) end the request without text, as in vLLM;
    their places and offsets stay. skip_special_tokens=False shows special tokens, include_stop_str_in_output the
    stop token."""
    im_end = tok.encode("<|im_end|>")
    assert len(im_end) == 1 and im_end[0] in tok.special_ids
    ids = tok.encode("Hi there") + im_end
    for options, want in [
        (TextOptions(), "Hi there"),
        (TextOptions(skip_special_tokens=False), "Hi there"),  # the stop token is left out either way
        (TextOptions(skip_special_tokens=False, include_stop_str_in_output=True), "Hi there<|im_end|>"),
        (TextOptions(include_stop_str_in_output=True), "Hi there"),  # shown, but special: skipped
    ]:
        choice = Choice(0, tok, options)
        choice.apply(update(ids, "stop"))
        text, kept, _, offsets = choice.delta()
        assert (text, kept, offsets[-1]) == (want, ids, len("Hi there"))
    stop_token = tok.encode(" there")
    assert len(stop_token) == 1 and stop_token[0] not in tok.special_ids
    choice = Choice(0, tok, TextOptions())
    for t in tok.encode("Hi"):
        choice.apply(update([t]))
    choice.apply(update(stop_token, "stop"))
    assert choice.text == "Hi" and choice.token_ids == tok.encode("Hi") + stop_token
    middle = Choice(0, tok, TextOptions())  # a special token mid-answer: skipped by default
    middle.apply(update(tok.encode("a") + im_end + tok.encode("b"), "length"))
    assert middle.text == "ab"


def test_include_stop_str_in_output_keeps_the_stop_string_and_holds_nothing_back(tok):
    ids = tok.encode("Hello world, stop here please")
    choice = Choice(0, tok, TextOptions(["stop here"], include_stop_str_in_output=True))
    sent = ""
    for t in ids:
        stopped = choice.apply(update([t]))
        piece = choice.delta()[0]
        assert choice.text.startswith(sent + piece) and (stopped or sent + piece == choice.text)  # no holdback
        sent += piece
        if stopped:
            break
    assert choice.finish_reason == "stop" and sent == choice.text == "Hello world, stop here"


def _byte_tokens(tok, text: str) -> list[int]:
    """`text` as one single-byte token per UTF-8 byte: a character's first tokens complete no text."""
    single = {tok.token_bytes(i): i for i in range(512) if len(tok.token_bytes(i)) == 1}
    return [single[bytes([b])] for b in text.encode()]


def test_without_stops_each_token_goes_out_before_its_character_completes(tok):
    ids = _byte_tokens(tok, "a🙂")
    choice = Choice(0, tok, TextOptions([]))
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
    choice = Choice(0, tok, TextOptions(["x"]))
    deltas = []
    for t in ids:
        choice.apply(update([t]))
        deltas.append(choice.delta())
    assert [d[1] for d in deltas] == [ids[:1], [], [], [], ids[1:]]
    assert "".join(d[0] for d in deltas) == "a🙂"

    cut = Choice(0, tok, TextOptions(["🙂"]))  # the completing token makes the stop: the character's tokens go out
    for t in ids:  # without text, once the stop ends the choice
        cut.apply(update([t]))
        text, kept, _, _ = cut.delta()
        first, last = t == ids[0], t == ids[-1]
        assert kept == (ids[:1] if first else ids[1:] if last else []) and text == ("a" if first else "")
    assert cut.finish_reason == "stop"


# Texts of one- to four-byte characters, a combining mark among them; tokens as the tokenizer merges them, or a byte
# each (a character's first tokens then complete no text).
ALPHABET = list("ab c\n.") + ["é", "\u0301", "你", "🙂"]


@st.composite
def stop_strings(draw, text: str) -> list[str]:
    """Pieces of the text (they occur) and short strings of its alphabet (they may)."""

    def piece() -> str:
        start = draw(st.integers(0, len(text) - 1))
        return text[start : start + draw(st.integers(1, 4))]

    anywhere = st.text(st.sampled_from(ALPHABET), min_size=1, max_size=3)
    return [piece() if text and draw(st.booleans()) else draw(anywhere) for _ in range(draw(st.integers(0, 3)))]


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_updates_and_polling_stream_the_text_cut_before_the_first_stop(tok, data):
    """Whatever the updates' sizes and however often the text is taken: the deltas add up to the choice's text, which
    is the whole text when no stop string occurs in it and otherwise ends right before one, holding none; the
    tokens sent are those whose text starts in it (all of them when nothing was cut)."""
    text = data.draw(st.text(st.sampled_from(ALPHABET), max_size=24))
    ids = data.draw(st.sampled_from([tok.encode(text), _byte_tokens(tok, text)]))
    stops = data.draw(stop_strings(text))
    choice = Choice(0, tok, TextOptions(stops))
    sent_text, sent_ids, start = "", [], 0
    while True:
        size = data.draw(st.integers(1, 3))
        last = start + size >= len(ids)
        choice.apply(update(ids[start : start + size], "length" if last else None))
        start += size
        if last or data.draw(st.booleans()):  # a server streaming takes each delta; one that is not, the last only
            piece, piece_ids, _, _ = choice.delta()
            sent_text, sent_ids = sent_text + piece, sent_ids + piece_ids
        if last:
            break
    full = tok.decode(ids)
    assert sent_text == choice.text and full.startswith(choice.text)
    assert not any(stop in choice.text for stop in stops)
    if choice.finish_reason == "stop":
        assert any(full.startswith(stop, len(choice.text)) for stop in stops)
        assert sent_ids == ids[: len(sent_ids)] == choice.token_ids and tok.decode(sent_ids).startswith(choice.text)
    else:
        assert choice.finish_reason == "length" and choice.text == full and sent_ids == ids


@pytest.mark.parametrize(
    "stops, stop_ids, ended_by, reason",
    [
        (["world", "lo"], [], "length", "lo"),  # the first stop string in the text, not the first listed
        ([], [13], "stop", 13),  # a stop_token_ids entry
        ([], [], "stop", None),  # the model's EOS
        ([], [13], "length", None),
    ],
)
def test_stop_reason_names_what_ended_the_choice(tok, stops, stop_ids, ended_by, reason):
    """vLLM's stop_reason: the stop string, or the request's stop token; None for EOS and any other end."""
    choice = Choice(0, tok, TextOptions(stops), stop_ids)
    choice.apply(update([*tok.encode("Hello world"), 13], ended_by))
    assert (choice.finish_reason, choice.stop_reason) == ("stop" if stops else ended_by, reason)


def test_eos_listed_in_stop_token_ids_names_no_stop_reason(tok):
    """vLLM's check_stop tests the tokenizer's EOS before stop_token_ids: a request listing <|im_end|> that ends on
    it gets stop_reason null, as an unlisted EOS does; with ignore_eos only the listing stops it, and names it."""
    choice = Choice(0, tok, TextOptions([]), [151645])
    choice.apply(update([*tok.encode("Hi"), 151645], "stop"))
    assert (choice.finish_reason, choice.stop_reason) == ("stop", None)
    ignoring = Choice(0, tok, TextOptions([]), [151645], ignore_eos=True)
    ignoring.apply(update([*tok.encode("Hi"), 151645], "stop"))
    assert ignoring.stop_reason == 151645
