"""The hermes tool-call parser: calls by token ids, whole and streamed (the id and name first, then argument pieces
that join into the whole's JSON) however the chunks cut the tokens; malformed blocks left as content; a call inside
the thinking is thinking."""

import json

import partial_json_parser
import pytest
from hypothesis import given
from hypothesis import strategies as st

from qwen3_runtime.server.chat_output import ChatOutput, ChatParsers
from qwen3_runtime.server.protocol import ChatCompletionRequest
from qwen3_runtime.server.reasoning import ReasoningParser
from qwen3_runtime.server.tool_parser import ToolCallParser, parse_call, stable_prefix
from qwen3_runtime.tokenizer import Tokenizer

WEATHER = {"city": "Zürich 🙂", "days": [1, 2.5, True, None], "units": {"temp": "C"}, "note": 'say "hi"\n'}


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.builtin_qwen3()


@pytest.fixture(scope="module")
def parsers(tok):
    return ChatParsers.of(tok, "qwen3", "hermes")


def call_text(name: str, arguments: dict) -> str:
    """A block as Qwen3's template writes one."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n</tool_call>'


def tools_output(parsers, parallel=True, reasoning=None):
    return ChatOutput(reasoning, ToolCallParser(parsers.tool_call, parallel))


def test_the_tags_are_single_tokens(tok, parsers):
    assert (parsers.tool_call.start, parsers.tool_call.end) == (151657, 151658)
    assert tok.encode("<tool_call></tool_call>") == [151657, 151658]


def test_content_then_calls_not_streamed(replay, tok, parsers):
    text = "Let me check.\n\n" + call_text("get_weather", WEATHER) + "\n" + call_text("now", {})
    out = tools_output(parsers)
    whole, _ = replay(tok, out, tok.encode(text), [])
    message = out.message(whole)
    assert message["content"] == "Let me check."  # the newlines before the call dropped
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "now"]
    assert [c["function"]["arguments"] for c in calls] == [json.dumps(WEATHER, ensure_ascii=False), "{}"]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    assert out.finish_reason("stop") == "tool_calls" and out.finish_reason("length") == "length"


@pytest.mark.parametrize("stops", [(), ("\x00" * 6,)])
def test_every_split_point_streams_the_same_calls(replay, tok, parsers, stops):
    text = "Sure." + call_text("get_weather", WEATHER) + "\n" + call_text("now", {"x": [{"y": "z"}]}) + "\n"
    ids = tok.encode(text)
    want = tools_output(parsers).message(replay(tok, tools_output(parsers), ids, [])[0])
    for k in range(len(ids) + 1):
        for splits in ([k], list(range(1, len(ids)))):
            out = tools_output(parsers)
            whole, chunks = replay(tok, out, ids, splits, stops)
            got = out.message(whole)
            assert [c["function"] for c in got["tool_calls"]] == [c["function"] for c in want["tool_calls"]]
            assert got["content"] == want["content"] == "Sure."
            pieces = [p for chunk in chunks for p in chunk.get("tool_calls", [])]
            for index in (0, 1):
                first, *rest = [p for p in pieces if p["index"] == index]
                assert first["id"].startswith("call_") and first["function"]["arguments"] == ""
                assert all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"} for p in rest)


def test_parallel_tool_calls_false_keeps_the_first(replay, tok, parsers):
    out = tools_output(parsers, parallel=False)
    whole, _ = replay(tok, out, tok.encode(call_text("a", {}) + "\n" + call_text("b", {})), [])
    assert [c["function"]["name"] for c in out.message(whole)["tool_calls"]] == ["a"]


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "f", "arguments": {"a": }}',  # bad JSON after the name
        '{name: "f"}',  # bad JSON before it
        '{"arguments": {}}',  # no name
        '{"name": "f", "arguments": "{}"}',  # arguments not an object
        '{"name": "f", "arguments": {"s": "\\ud800"}}',  # a lone surrogate, which no UTF-8 response carries
    ],
)
def test_a_block_that_is_no_call_stays_content(replay, tok, parsers, body):
    text = f"Hi <tool_call>\n{body}\n</tool_call>"
    out = tools_output(parsers)
    whole, _ = replay(tok, out, tok.encode(text), [])
    assert out.message(whole) == {"content": text}
    assert out.finish_reason("stop") == "stop"
    if body.startswith("{name"):  # found malformed before a name went out: streamed alike
        out = tools_output(parsers)
        whole, _ = replay(tok, out, tok.encode(text), range(len(tok.encode(text))))
        assert out.message(whole) == {"content": text}


@pytest.mark.parametrize(
    "text, finish",
    [
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1, "b": }}\n</tool_call>', "stop"),
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1, "b', "length"),
    ],
)
def test_streamed_a_call_named_before_its_json_broke_ends_as_json(replay, tok, parsers, text, finish):
    """Its name went out, so it stays a call, with the arguments read before the break (or the end) as JSON."""
    ids = tok.encode(text)
    out = tools_output(parsers)
    whole, _ = replay(tok, out, ids, range(1, len(ids)), finish=finish)
    (call,) = out.message(whole)["tool_calls"]
    assert call["function"] == {"name": "f", "arguments": '{"a": 1}'}


def test_a_block_left_open_at_the_end(replay, tok, parsers):
    whole_call = call_text("f", {"a": 1}).removesuffix("\n</tool_call>")
    out = tools_output(parsers)
    whole, _ = replay(tok, out, tok.encode(whole_call), [], finish="length")
    assert out.message(whole)["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    cut = whole_call[:-3]
    out = tools_output(parsers)
    whole, _ = replay(tok, out, tok.encode(cut), [], finish="length")
    assert out.message(whole) == {"content": cut} and out.finish_reason("length") == "length"


def test_a_call_while_thinking_is_thinking(replay, tok, parsers):
    thought = "\nmaybe " + call_text("f", {}) + "\n"
    out = tools_output(parsers, reasoning=ReasoningParser(parsers.think))
    whole, _ = replay(tok, out, tok.encode(f"<think>{thought}</think>\n\n" + call_text("g", {})), [])
    message = out.message(whole)
    assert message["reasoning"] == thought and message["content"] is None
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["g"]


def test_tool_choice_decides_the_parsing(parsers):
    tools = [{"type": "function", "function": {"name": "f"}}]

    def output(**fields):
        req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], **fields)
        return ChatOutput.for_request(parsers, req, [1])

    assert output(tools=tools).tools is not None and output().tools is None
    assert output(tools=tools, tool_choice="none").tools is None
    named = output(tools=tools, tool_choice={"type": "function", "function": {"name": "f"}})
    named.tools.calls = 1
    assert named.finish_reason("stop") == "stop"  # OpenAI's for a named function
    assert output(tools=tools, parallel_tool_calls=False).tools.parallel is False


def test_parse_call():
    assert parse_call('\n{"name": "f", "arguments": {"a": "é"}}\n') == ("f", '{"a": "é"}')
    assert parse_call('{"name": "f"}') == ("f", "{}")
    assert parse_call('{"name": "f"} {}') is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.text(max_size=5), JSON, max_size=4), st.sampled_from([(", ", ": "), (",", ":")]))
def test_stable_prefix_never_takes_back_what_it_sent(arguments, separators):
    """Every prefix of the model's text (any spacing, escapes and all) gives a prefix of the final JSON text."""
    final = json.dumps(arguments, ensure_ascii=False)
    text = json.dumps(arguments, separators=separators)
    sent = ""
    for end in range(1, len(text) + 1):
        try:
            partial = partial_json_parser.loads(text[:end])
        except Exception:  # a prefix the library cannot read yet: nothing is sent
            continue
        prefix = stable_prefix(partial)
        assert final.startswith(prefix), (text[:end], prefix)
        sent = max(sent, prefix, key=len)
    assert final.startswith(sent)
