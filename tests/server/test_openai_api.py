"""The server end to end through the official openai client: greedy text equals the offline Runtime's tokens
decoded, streaming with logprobs, echo, stop strings, n > 1, errors, and the API key."""

import json
import time

import httpx
import openai
import pytest

from qwen3_runtime.params import SamplingParams

PROMPT = "The capital of France is"
ABORTED, FINISHED = "qwen3_runtime_requests_aborted_total", "qwen3_runtime_requests_finished_total"


@pytest.fixture(scope="module")
def offline(make_runtime_module):
    return make_runtime_module


def greedy_offline(rt, prompt_ids, max_tokens):
    out = rt.generate([prompt_ids], SamplingParams(max_tokens=max_tokens, temperature=0))[0]
    assert out.error is None
    return out.token_ids


def shown(tok, ids, max_tokens):
    """The text the server gives for these tokens: a stop token (the request ended before max_tokens) and special
    tokens give none."""
    return tok.decode(ids[:-1] if len(ids) < max_tokens else ids, skip_special_tokens=True)


def test_completion_greedy_equals_offline(client, offline):
    tok = offline.tokenizer
    ids = tok.encode(PROMPT)
    expected = greedy_offline(offline, ids, 6)
    for prompt in (PROMPT, ids):
        resp = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0)
        (choice,) = resp.choices
        assert choice.text == shown(tok, expected, 6)
        assert choice.finish_reason == ("stop" if len(expected) < 6 else "length")
        assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (len(ids), len(expected))


def test_chat_greedy_equals_offline(client, offline):
    tok = offline.tokenizer
    messages = [{"role": "user", "content": "Hello!"}]
    ids = tok.encode(tok.apply_chat_template(messages))
    expected = greedy_offline(offline, ids, 5)
    resp = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0)
    assert resp.choices[0].message.content == shown(tok, expected, 5)
    assert resp.choices[0].message.role == "assistant"
    assert resp.usage.total_tokens == len(ids) + len(expected)


def test_logit_bias_steers_the_text_as_offline(client, offline):
    tok = offline.tokenizer
    forced = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, seed=3, logit_bias={"40": 100})
    assert forced.choices[0].text == tok.decode([40] * 4)
    messages = [{"role": "user", "content": "Hello!"}]
    ids = tok.encode(tok.apply_chat_template(messages))
    banned = dict.fromkeys(greedy_offline(offline, ids, 5), -100.0)
    expected = offline.generate([ids], SamplingParams(max_tokens=5, temperature=0, logit_bias=banned))[0].token_ids
    resp = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, temperature=0, logit_bias={str(t): b for t, b in banned.items()}
    )
    assert resp.choices[0].message.content == shown(tok, expected, 5) and not set(banned) & set(expected)


def test_completion_stream_with_logprobs_matches_whole(client):
    args = dict(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    whole = client.completions.create(**args).choices[0]
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert text == whole.text
    assert tokens == whole.logprobs.tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.finish_reason
    assert chunks[-1].usage.completion_tokens == 5 and not chunks[-1].choices
    tops = zip(whole.logprobs.tokens, whole.logprobs.token_logprobs, whole.logprobs.top_logprobs)
    assert all(len(top) <= 3 and top[token] == value for token, value, top in tops)  # the token itself, then 2
    assert whole.logprobs.text_offset == sorted(whole.logprobs.text_offset)


def test_chat_stream_with_logprobs(client):
    args = dict(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
    whole = client.chat.completions.create(**args, logprobs=True, top_logprobs=2).choices[0]
    stream = client.chat.completions.create(
        **args, logprobs=True, top_logprobs=2, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.message.content
    assert [e.token for e in content] == [e.token for e in whole.logprobs.content]
    assert len(content) == 4 and chunks[-1].usage.completion_tokens == 4
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.logprob <= 0 and isinstance(entry.bytes, list)
        assert entry.top_logprobs[0].logprob >= entry.logprob


def test_echo_puts_prompt_logprobs_first(client, offline):
    ids = offline.tokenizer.encode(PROMPT)
    resp = client.completions.create(model="tiny", prompt=ids, max_tokens=3, temperature=0, logprobs=1, echo=True)
    choice = resp.choices[0]
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset[len(ids)] == len(PROMPT)


def test_prompt_logprobs_extension(http):
    body = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    entries = choice["prompt_logprobs"]
    assert entries[0] is None and len(entries) > 1
    assert all("logprob" in v and "rank" in v for e in entries[1:] for v in e.values())


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_output(client, metric, stream):
    """The text ends before the stop string (vLLM's stop_reason names it); logprobs cover every token usage counts;
    the metrics count a stop."""
    args = dict(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=1, extra_body={"ignore_eos": True})
    full = client.completions.create(**args).choices[0].text
    stop = full[6:9]
    expected = full[: full.index(stop)]
    stops, aborted = f'{FINISHED}{{finish_reason="stop"}}', metric(ABORTED)
    stops_before = metric(stops)
    if stream:
        usage_chunk = {"include_usage": True}
        chunks = list(client.completions.create(**args, stop=[stop], stream=True, stream_options=usage_chunk))
        text, reason = "".join(c.choices[0].text for c in chunks if c.choices), chunks[-2].choices[0].finish_reason
        stop_reason = chunks[-2].choices[0].stop_reason
        tokens = sum(len(c.choices[0].logprobs.tokens) for c in chunks if c.choices and c.choices[0].logprobs)
        usage = chunks[-1].usage
    else:
        resp = client.completions.create(**args, stop=[stop])
        text, reason, tokens = resp.choices[0].text, resp.choices[0].finish_reason, len(resp.choices[0].logprobs.tokens)
        usage, stop_reason = resp.usage, resp.choices[0].stop_reason
    assert (text, reason, stop_reason) == (expected, "stop", stop) and tokens == usage.completion_tokens
    deadline = time.monotonic() + 20
    while metric(stops) == stops_before:  # counted when the engine's end of the request arrives
        assert time.monotonic() < deadline, "the stop was not counted"
        time.sleep(0.05)
    assert metric(ABORTED) == aborted


def test_n_choices_seeded(client, offline, metric):
    args = dict(model="tiny", prompt=PROMPT, max_tokens=4, temperature=1.0, n=3, seed=7)
    prompt_tokens = metric("qwen3_runtime_prompt_tokens_total")
    first, again = client.completions.create(**args), client.completions.create(**args)
    assert metric("qwen3_runtime_prompt_tokens_total") - prompt_tokens == 2 * first.usage.prompt_tokens
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert first.usage.completion_tokens == 12
    assert first.usage.prompt_tokens == len(offline.tokenizer.encode(PROMPT))  # once, not per choice


@pytest.mark.parametrize(
    "body, param, message",
    [
        ({"prompt": "x", "top_p": 3}, "top_p", "less than or equal to 1"),
        ({"prompt": "x", "logprobs": 30}, "logprobs", "Requested sample logprobs of 30, which is greater than max"),
        # -1 (the whole vocabulary) is the engine's to allow: its message says how
        ({"prompt": "x", "logprobs": -1}, "logprobs", "-1, the full vocabulary, needs logprobs.max_logprobs: -1"),
        ({"prompt": "x", "extra_body": {"prompt_logprobs": -1}}, "prompt_logprobs", "needs logprobs.max_logprobs: -1"),
        ({"prompt": [1, 10**9]}, "prompt", "out of range"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"prompt": []}, "prompt", "empty"),
        # vLLM's words for the context window (256 tokens in the tiny config), which clients read limits from
        ({"prompt": [5] * 250, "max_tokens": 7}, "max_tokens", "is too large: 7. This model's maximum context length"),
        ({"prompt": [5] * 256}, "prompt", "maximum context length is 256 tokens. However, your request has 256"),
    ],
)
def test_bad_completion_request_is_400_naming_the_parameter(client, body, param, message):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", **body)
    error = info.value.body
    assert error["param"] == param and message in error["message"], error
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert client.completions.create(model="tiny", prompt="x", max_tokens=1).choices  # still serving


def test_a_request_for_another_model_is_404(client):
    calls = [
        lambda: client.completions.create(model="gpt-4o", prompt="x", max_tokens=1),
        lambda: client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}]),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as info:
            call()
        assert info.value.body["param"] == "model" and "gpt-4o" in info.value.body["message"]


def test_bad_chat_request(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], top_logprobs=2)
    assert info.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=21
        )
    assert info.value.body["param"] == "top_logprobs"
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=300)
    assert info.value.body["param"] == "max_completion_tokens" and "is too large: 300" in info.value.body["message"]


def test_disconnect_mid_stream_aborts_the_request(base_url, api_key, metric):
    aborted = metric(ABORTED)
    body = {"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stream": True}
    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, headers=headers, timeout=60) as resp:
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["choices"]
    wait_aborted(metric, aborted)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_disconnect_before_a_whole_response_aborts_the_request(base_url, api_key, metric, path):
    aborted = metric(ABORTED)
    body = {"max_tokens": 230, "ignore_eos": True, "temperature": 0}
    body.update({"prompt": PROMPT} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "Hi"}]})
    headers = {"Authorization": f"Bearer {api_key}"}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up long before 230 tokens
        httpx.post(f"{base_url}{path}", json=body, headers=headers, timeout=0.3)
    wait_aborted(metric, aborted)


def wait_aborted(metric, aborted_before: float) -> None:
    """The server counts one more aborted request, and none runs any more."""
    deadline = time.monotonic() + 20
    while metric(ABORTED) == aborted_before:
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.1)
    assert metric("qwen3_runtime_num_requests_running") == 0


def test_models_health_metrics(http, base_url, metric, client):
    (card,) = http.get("/v1/models").json()["data"]
    assert card["id"] == "tiny" and time.time() - 3600 < card["created"] <= time.time()  # the server's start
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4o")
    assert err.value.body["message"] == "The model 'gpt-4o' does not exist" and err.value.body["param"] == "model"
    assert httpx.get(f"{base_url}/health").status_code == 200  # no key needed
    text = http.get("/metrics").text
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "engine_d2h_bytes_per_step"):
        assert f"qwen3_runtime_{name}" in text
    assert metric("qwen3_runtime_generation_tokens_total") > 0
    assert metric("qwen3_runtime_prefix_cache_queries_total") >= metric("qwen3_runtime_prefix_cache_hits_total") >= 0


def test_api_key_guards_the_v1_routes_only(base_url):
    """As vLLM's: Prometheus scrapers and health probes carry no key."""
    for path in ("/v1/models", "/v1/models/tiny"):
        resp = httpx.get(f"{base_url}{path}", headers={"Authorization": "Bearer wrong"})
        assert resp.status_code == 401 and resp.json()["error"]["type"] == "AuthenticationError"
    assert httpx.post(f"{base_url}/v1/completions", json={"prompt": "x"}).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base_url}/v1", api_key="wrong", max_retries=0).models.list()
    for path in ("/health", "/metrics", "/version"):
        assert httpx.get(f"{base_url}{path}").status_code == 200, path
    assert httpx.post(f"{base_url}/tokenize", json={"prompt": "x"}).json()["count"] == 1
    assert httpx.post(f"{base_url}/detokenize", json={"tokens": [87]}).json()["prompt"] == "x"


def test_unset_fields_take_the_checkpoints_generation_config(launch_server, tiny_checkpoint, tmp_path):
    """As vLLM's `--generation-config auto`: a checkpoint recommending greedy decoding and 3 tokens makes requests
    that set neither greedy (two unseeded choices agree) and 3 tokens long; a max_tokens asked for stands."""
    import shutil

    path = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, path)
    (path / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_new_tokens": 3}))
    _, url = launch_server("--set", f"model.path={path}", "--set", "model.tokenizer=builtin")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    unset = client.completions.create(model="tiny", prompt=[1, 2, 3], n=2, extra_body={"max_tokens": None})
    greedy = client.completions.create(model="tiny", prompt=[1, 2, 3], temperature=0, max_tokens=3)
    assert [c.text for c in unset.choices] == [greedy.choices[0].text] * 2
    assert (unset.usage.completion_tokens, greedy.usage.completion_tokens) == (6, 3)
    asked = client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=5, extra_body={"ignore_eos": True})
    assert asked.usage.completion_tokens == 5


def test_tokenize_detokenize_and_version_routes(http, client):
    """vLLM's utility routes over the socket: /tokenize counts what a chat request's usage counts."""
    messages = [{"role": "user", "content": "What is 2+2?"}]
    counted = http.post("/tokenize", json={"model": "tiny", "messages": messages}).json()
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
    assert counted["count"] == len(counted["tokens"]) == chat.usage.prompt_tokens
    text = http.post("/detokenize", json={"tokens": counted["tokens"]}).json()["prompt"]
    assert text.startswith("<|im_start|>user\nWhat is 2+2?<|im_end|>")
    bad = http.post("/detokenize", json={"tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert http.post("/tokenize", json={"model": "other", "prompt": "x"}).status_code == 404
    assert http.get("/version").json()["version"]


def test_a_moe_model_serves_text_and_logprobs_as_offline(launch_server):
    """Qwen3-MoE behind the same server (configs/tiny-moe.yaml): greedy streamed chat text with logprobs is the
    offline Runtime's, its logprobs the offline ones, and a completion's prompt logprobs come back too."""
    from qwen3_runtime import Runtime, ops

    _, url = launch_server("--config", "tiny-moe")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "What is 2+2?"}]
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2, stream=True
    )
    chunks = [c for c in stream if c.choices and c.choices[0].logprobs]
    served = [t.logprob for c in chunks for t in c.choices[0].logprobs.content]
    saved, ops.TRITON_INTERPRET = ops.TRITON_INTERPRET, False
    try:
        rt = Runtime.from_yaml("tiny-moe")
        tok = rt.tokenizer
        out = rt.generate([tok.encode(tok.apply_chat_template(messages))], SamplingParams(max_tokens=6, temperature=0))
    finally:
        ops.TRITON_INTERPRET = saved
    expected = out[0].token_ids
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == shown(tok, expected, 6)
    assert len(served) == len(expected)
    echoed = client.completions.create(model=model, prompt="2+2", max_tokens=1, echo=True, logprobs=1)
    assert echoed.choices[0].logprobs.token_logprobs[1] is not None
