"""POST /v1/chat/completions with the parsers on, through the official openai client, over the app in this process
and an engine that answers a canned token sequence: the route's own path from tokens to the message and to the
streamed chunks (a random model writes neither thinking nor tool calls)."""

import itertools
import json

import openai
import pytest
from fastapi.testclient import TestClient

from qwen3_runtime.params import RequestLimits
from qwen3_runtime.request import RequestUpdate
from qwen3_runtime.server.chat_output import ChatParsers
from qwen3_runtime.server.metrics import ServerMetrics
from qwen3_runtime.server.openai_api import build_app
from qwen3_runtime.server.state import ServerState
from qwen3_runtime.tokenizer import Tokenizer

EOS = 151645
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
ARGUMENTS = {"city": "Zürich", "days": 3}
ANSWER = (
    '<think>\nCall it.\n</think>\n\nChecking.\n<tool_call>\n{"name": "weather", "arguments": '
    + json.dumps(ARGUMENTS, ensure_ascii=False)
    + "}\n</tool_call>"
)


class CannedEngine:
    """The EngineClient the routes use: every request is answered `script` then EOS, a token per update."""

    alive = True

    def __init__(self) -> None:
        self.script: list[int] = []
        self._ids = itertools.count()

    def attach(self, loop) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def new_id(self) -> str:
        return str(next(self._ids))

    def add(self, request_id, prompt, params, queue, first=True) -> None:
        ids = (self.script + [EOS])[: params.max_tokens]
        for i, t in enumerate(ids):
            finish = None if i < len(ids) - 1 else "stop" if t == EOS else "length"
            queue.put_nowait(RequestUpdate(request_id, [t], None, None, finish, None, len(prompt)))

    def abort(self, request_id, stopped=False) -> None:
        pass


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.builtin_qwen3()


def app_client(tok, engine, *parsers):
    limits = RequestLimits(vocab_size=151936, max_model_len=4096, max_logprobs=5)
    state = ServerState(engine, tok, "tiny", limits, {}, ServerMetrics(), parsers=ChatParsers.of(tok, *parsers))
    return TestClient(build_app(state))


@pytest.fixture(scope="module")
def api(tok):
    """(engine, openai client) of an app with both parsers on."""
    engine = CannedEngine()
    with app_client(tok, engine, "qwen3", "hermes") as http:
        yield engine, openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


def ask(client, **fields):
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], **fields)


def test_thinking_content_and_a_call(api, tok):
    engine, client = api
    engine.script = tok.encode(ANSWER)
    choice = ask(client, tools=TOOLS).choices[0]
    message = choice.message
    assert message.reasoning_content == message.reasoning == "\nCall it.\n"
    assert message.content == "\n\nChecking."
    (call,) = message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "weather"
    assert json.loads(call.function.arguments) == ARGUMENTS and "Zürich" in call.function.arguments
    assert choice.finish_reason == "tool_calls"


def test_streamed_alike(api, tok):
    engine, client = api
    engine.script = tok.encode(ANSWER)
    chunks = list(ask(client, tools=TOOLS, stream=True))
    deltas = [c.choices[0].delta for c in chunks]
    for name in ("reasoning_content", "reasoning"):  # extra fields to the client: absent from the other deltas
        assert "".join(getattr(d, name, None) or "" for d in deltas) == "\nCall it.\n"
    assert "".join(d.content or "" for d in deltas) == "\n\nChecking."
    pieces = [p for d in deltas for p in d.tool_calls or ()]
    assert pieces[0].id.startswith("call_") and pieces[0].function.name == "weather"
    assert all(p.index == 0 and p.id is None and p.function.name is None for p in pieces[1:])
    assert json.loads("".join(p.function.arguments for p in pieces)) == ARGUMENTS
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_and_no_tools_leave_the_text(api, tok):
    engine, client = api
    engine.script = tok.encode("Sure.<tool_call>\n{}\n</tool_call>")
    for fields in ({"tools": TOOLS, "tool_choice": "none"}, {}):
        choice = ask(client, **fields).choices[0]
        assert choice.message.content == "Sure.<tool_call>\n{}\n</tool_call>" and choice.message.tool_calls is None
        assert choice.finish_reason == "stop"


def test_thinking_cut_short_and_include_reasoning(api, tok):
    engine, client = api
    engine.script = tok.encode("<think>\nStill thinking")
    choice = ask(client, max_tokens=3).choices[0]
    assert (choice.message.reasoning_content, choice.message.content, choice.finish_reason) == (
        "\nStill",
        None,
        "length",
    )
    choice = ask(client, max_tokens=3, extra_body={"include_reasoning": False}).choices[0]
    assert choice.message.reasoning_content is None


def test_parsers_off_leave_everything_in_content(tok):
    engine = CannedEngine()
    engine.script = tok.encode(ANSWER)
    with app_client(tok, engine, None, None) as http:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}
        message = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert message == {"role": "assistant", "content": ANSWER}
        error = http.post("/v1/chat/completions", json={**body, "tools": TOOLS}).json()["error"]
        assert error["param"] == "tools" and "--tool-call-parser" in error["message"]
