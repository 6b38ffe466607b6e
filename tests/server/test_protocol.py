"""What the server refuses and what it lets through: unsupported sampling fields (a 400 unless off), penalties and
logit_bias (accepted, a 400 out of range), a float that is not finite (a 400 saying so), a body that is not UTF-8,
metadata and unknown fields (accepted), chat roles (the template's, developer as system, any other a 400), chat
content as a list of parts (text joined, anything else a 400)."""

import json
import logging

import openai
import pytest

from qwen3_runtime.server.protocol import CompletionRequest

COMPLETION = ("/v1/completions", {"prompt": "The capital of France is"})
CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
JSON = {"Content-Type": "application/json"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(
    "endpoint, field, value",
    [
        (COMPLETION, "best_of", 2),
        (COMPLETION, "suffix", "!"),
        (CHAT, "functions", [TOOL["function"]]),  # OpenAI's deprecated names for tools and tool_choice
        (CHAT, "function_call", {"name": "f"}),
        (CHAT, "use_beam_search", True),
    ],
)
def test_unsupported_field_is_400_naming_it(http, endpoint, field, value):
    path, body = endpoint
    resp = http.post(path, json={**body, "max_tokens": 2, field: value})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == field and "not supported" in error["message"], error


def test_unsupported_field_through_the_openai_client(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
            extra_body={"bad_words": ["x"]},
        )
    assert info.value.body["param"] == "bad_words"


PENALTIES = {
    "presence_penalty": 1.5,
    "frequency_penalty": -0.5,
    "repetition_penalty": 1.3,
    "min_p": 0.1,
    "min_tokens": 3,
    "logit_bias": {"42": 2.5, "7": -100},
}


@pytest.mark.parametrize("endpoint", [COMPLETION, CHAT], ids=["completions", "chat"])
def test_penalties_and_min_p_are_accepted(http, endpoint):
    path, body = endpoint
    base = {**body, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    plain, penalized = http.post(path, json=base), http.post(path, json={**base, **PENALTIES})
    assert penalized.status_code == 200, penalized.text
    assert penalized.json()["usage"]["completion_tokens"] == 6
    assert penalized.json()["choices"] != plain.json()["choices"]


@pytest.mark.parametrize(
    "endpoint, field, value",
    [
        (COMPLETION, "presence_penalty", 2.5),
        (CHAT, "frequency_penalty", -3),
        (COMPLETION, "repetition_penalty", 0),
        (CHAT, "min_p", 1.5),
        (COMPLETION, "min_tokens", -1),
        (CHAT, "min_tokens", 3),  # above max_tokens 2: the params' check
        (COMPLETION, "logit_bias", {"42": 100.5}),
        (CHAT, "logit_bias", {"forty-two": 1}),
        (COMPLETION, "logit_bias", {"151936": 1}),  # past the vocabulary
        (CHAT, "logit_bias", {"-1": 1}),
    ],
)
def test_out_of_range_penalty_is_400_naming_it(http, endpoint, field, value):
    path, body = endpoint
    resp = http.post(path, json={**body, "max_tokens": 2, field: value})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == field, resp.json()


FLOATS = ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"]


@pytest.mark.parametrize("endpoint", [COMPLETION, CHAT], ids=["completions", "chat"])
def test_a_float_that_is_not_finite_is_400_saying_so(http, endpoint):
    """NaN too, which fails every bound: the message says what is wrong with it, not which bound it failed."""
    path, body = endpoint
    cases = [(name, value) for name in FLOATS for value in (float("nan"), float("inf"))]
    for name, value in [*cases, ("logit_bias", {"42": float("nan")})]:
        raw = json.dumps({**body, "max_tokens": 1, name: value})  # NaN and Infinity as Python's parser reads them
        resp = http.post(path, content=raw, headers=JSON)
        error = resp.json()["error"]
        assert resp.status_code == 400 and error["param"].startswith(name), (name, error)
        assert error["message"].endswith("Input should be a finite number"), (name, error)


def test_a_body_that_is_not_utf8_is_400_saying_so(http):
    resp = http.post(COMPLETION[0], content=b'{"prompt": "caf\xe9", "max_tokens": 1}', headers=JSON)
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["param"] is None
    assert error["message"] == (
        "the request body must be UTF-8 JSON: 'utf-8' codec can't decode byte 0xe9 in position 15: invalid "
        "continuation byte"
    )


@pytest.mark.parametrize("endpoint", [COMPLETION, CHAT], ids=["completions", "chat"])
def test_off_values_metadata_and_unknown_fields_change_nothing(http, endpoint):
    path, body = endpoint
    base = {**body, "max_tokens": 5, "temperature": 0}
    extras = {
        "presence_penalty": 0.0,
        "frequency_penalty": 0,
        "logit_bias": {},
        "repetition_penalty": None,
        "min_p": 0.0,
        "min_tokens": 0,
        "user": "someone",
        "metadata": {"k": "v"},
        "service_tier": "auto",
        "stream_options": {"include_usage": True},
        "not_an_openai_field": 1,
    }
    if path == "/v1/completions":
        extras.update(best_of=1, suffix=None)
    else:
        extras.update(response_format={"type": "text"}, tool_choice="none", tools=[], parallel_tool_calls=False)
    plain, with_extras = http.post(path, json=base), http.post(path, json={**base, **extras})
    assert with_extras.status_code == 200, with_extras.text
    assert with_extras.json()["choices"] == plain.json()["choices"]


def test_unknown_field_is_logged_once(caplog):
    with caplog.at_level(logging.WARNING, logger="qwen3_runtime.server.protocol"):
        CompletionRequest(prompt="x", some_vendor_field=1)
        CompletionRequest(prompt="x", some_vendor_field=2)
    assert [r.getMessage() for r in caplog.records] == [
        "request field 'some_vendor_field' is not part of OpenAI's API: ignored"
    ]


def test_chat_text_parts_are_joined_with_newlines(client):
    args = dict(model="tiny", max_tokens=5, temperature=0)
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
    joined = client.chat.completions.create(messages=[{"role": "user", "content": "Hello\nthere"}], **args)
    as_parts = client.chat.completions.create(messages=[{"role": "user", "content": parts}], **args)
    assert as_parts.choices[0].message.content == joined.choices[0].message.content
    assert as_parts.usage.prompt_tokens == joined.usage.prompt_tokens


def test_a_role_the_template_does_not_render_is_400_naming_it(client, http):
    """Qwen3's template would drop the message from the prompt without a word."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "wizard", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
    error = info.value.body
    assert error["param"] == "messages[1].role" and error["message"] == (
        "messages[1].role 'wizard' is not supported: the roles are system, user, assistant, tool, developer"
    )
    assert http.post("/tokenize", json={"messages": messages}).json()["error"]["param"] == "messages[1].role"


def test_a_developer_message_is_a_system_message(http):
    """OpenAI's newer name for the system role."""
    ids = [
        http.post("/tokenize", json={"messages": [{"role": role, "content": "Be brief."}]}).json()["tokens"]
        for role in ("developer", "system")
    ]
    assert ids[0] == ids[1]


def test_chat_non_text_part_is_400_naming_it(client):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]},
    ]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    error = info.value.body
    assert error["param"] == "messages[1].content[1].type" and "image_url" in error["message"], error
