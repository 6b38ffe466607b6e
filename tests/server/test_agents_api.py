"""Thinking and tools through real servers and the official openai client: `--reasoning-parser qwen3` splits what
logit_bias forces the tiny random model to write (a repetition penalty of 10 makes each biased token give way to
the next after it was written once), over Qwen3's template and a template that pre-opens the thinking as
Qwen3-*-Thinking-2507's does; tools reach the template and are accepted with `--tool-call-parser hermes`, and bad
tool fields are a 400 naming them."""

import json

import httpx
import openai
import pytest

from qwen3_runtime.tokenizer import Tokenizer
from qwen3_runtime.tokenizer.chat_template import QWEN3_CHAT_TEMPLATE

THINK, END, YES, Z = 151667, 151668, 9454, 57  # <think>, </think>, "Yes", "Z"
HI = [{"role": "user", "content": "Hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def forced(*tokens: int) -> dict:
    """Greedy fields that make the model write `tokens` in order."""
    bias = {str(t): 100 - 20 * i for i, t in enumerate(tokens)}
    return dict(temperature=0, max_tokens=len(tokens), logit_bias=bias, extra_body={"repetition_penalty": 10})


def both(client, **fields):
    """(reasoning, content) of a response, and of its stream joined up: they must agree."""
    message = client.chat.completions.create(model="tiny", messages=HI, **fields).choices[0].message
    chunks = list(client.chat.completions.create(model="tiny", messages=HI, stream=True, **fields))
    deltas = [c.choices[0].delta for c in chunks]
    streamed = ["".join(getattr(d, name, None) or "" for d in deltas) for name in ("reasoning", "content")]
    assert streamed == [message.reasoning or "", message.content or ""]
    assert message.reasoning == message.reasoning_content
    return message.reasoning, message.content


def connect(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def agents_url(launch_server):
    return launch_server("--reasoning-parser", "qwen3", "--tool-call-parser", "hermes")[1]


@pytest.fixture(scope="module")
def agents(agents_url):
    return connect(agents_url)


@pytest.fixture(scope="module")
def thinking_model(launch_server, tmp_path_factory):
    """A server whose template opens the thinking in the prompt, as Qwen3-*-Thinking-2507's does."""
    path = tmp_path_factory.mktemp("thinking-tokenizer")
    Tokenizer.builtin_qwen3().hf_tokenizer.save(str(path / "tokenizer.json"))
    prompt = "{{- '<|im_start|>assistant\\n' }}"
    template = QWEN3_CHAT_TEMPLATE.replace(prompt, prompt.replace("\\n", "\\n<think>\\n"))
    config = {"chat_template": template, "eos_token": "<|im_end|>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return connect(launch_server("--reasoning-parser", "qwen3", "--set", f"model.tokenizer={path}")[1])


def test_the_model_opens_and_closes_its_thinking(agents):
    assert both(agents, **forced(THINK, YES, END, Z)) == ("Yes", "Z")


def test_enable_thinking_false_makes_everything_content(agents):
    fields = forced(THINK, YES, END, Z)
    fields["extra_body"]["chat_template_kwargs"] = {"enable_thinking": False}
    reasoning, content = both(agents, **fields)
    assert reasoning is None and "<think>" in content  # the tags the prompt holds are penalized: another order


@pytest.mark.parametrize(
    "tokens, split",
    [((END, Z), (None, "Z")), ((YES, END, Z), ("Yes", "Z")), ((YES, Z), ("YesZ", None))],
)
def test_a_template_that_opened_the_thinking(thinking_model, tokens, split):
    """</think> first ends thinking that never started; no </think> leaves it all thinking (max_tokens hit)."""
    assert both(thinking_model, **forced(*tokens)) == split


def test_tools_reach_the_template(agents, agents_url):
    bodies = [{"messages": HI}, {"messages": HI, "tools": TOOLS}]
    counts = [httpx.post(f"{agents_url}/tokenize", json=body).json()["count"] for body in bodies]
    assert counts[1] > counts[0] + 40
    for choice in ("auto", "none", "required", {"type": "function", "function": {"name": "weather"}}):
        response = agents.chat.completions.create(
            model="tiny", messages=HI, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, max_tokens=2
        )
        assert response.usage.prompt_tokens == counts[1]


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "weather"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval", "function": {"name": "a"}}]}, "tools[0].type"),
        (
            {"tools": [{"type": "function", "function": {"name": "a", "parameters": []}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": TOOLS * 2}, "tools[1].function.name"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
    ],
)
def test_bad_tool_fields_are_400_naming_them(agents, fields, param):
    with pytest.raises(openai.BadRequestError) as e:
        agents.chat.completions.create(model="tiny", messages=HI, max_tokens=1, **fields)
    assert e.value.body["param"] == param, e.value.body


def test_tools_without_the_parser_are_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=HI, tools=TOOLS, max_tokens=1)
    assert e.value.body["param"] == "tools" and "--tool-call-parser hermes" in e.value.body["message"]
    shown = client.chat.completions.create(model="tiny", messages=HI, tools=TOOLS, tool_choice="none", max_tokens=1)
    assert shown.choices[0].message.tool_calls is None
