"""Fuzzing the HTTP API (issue 38): a well-formed body with one field made wrong (a wrong type, out of range,
NaN/inf, odd unicode, token ids outside the vocabulary, a prompt over max_model_len, a penalty or a logit_bias out
of range), a required field dropped or an unknown one added, and raw bodies that are not a JSON object. Never a 5xx;
a 4xx is OpenAI's error naming the field it is about (param is null only for errors about the body as a whole: not
JSON, not an object, too large); a 200 is a well-formed completion; and a good request sent every few examples
still succeeds.

Bodies are sent as text from json.dumps, which writes NaN and Infinity as the bare tokens Python's parser reads.
Valid requests ask for one or two tokens: on a CPU each costs a step of the tiny model."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

VOCAB, MAX_MODEL_LEN, MAX_LOGPROBS, MAX_LOGIT_BIAS = 151936, 256, 20, 1024
GOOD_EVERY = 8
FUZZ = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))

# Values of any JSON type, the odd ones often: huge, negative, NaN/inf, empty and non-ASCII strings.
huge_ints = st.sampled_from([-(2**70), -1, 0, 2**31, 2**63, 10**30])
odd_floats = st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.5, 1e308, 2.5])
odd_text = st.sampled_from(["", " ", "\u0000", "\U0001f600", "ÿ\u202e", "x" * 300])
scalars = st.one_of(st.none(), st.booleans(), huge_ints, odd_floats, odd_text, st.integers(), st.text(max_size=8))
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner))

token_ids = st.lists(st.integers(-5, VOCAB - 1) | st.sampled_from([VOCAB, VOCAB + 1, 2**40]), min_size=1, max_size=4)
BAD: dict[str, st.SearchStrategy] = {
    "prompt": st.one_of(
        token_ids, st.lists(token_ids, max_size=2), st.just("hi " * (MAX_MODEL_LEN + 10)), st.just([[]]), st.just([])
    ),
    "max_tokens": st.integers(max_value=0) | odd_floats,
    "n": st.integers(max_value=0) | st.integers(min_value=129) | odd_floats,
    "logprobs": st.integers(min_value=MAX_LOGPROBS + 1) | st.integers(max_value=-1),
    "prompt_logprobs": st.integers(min_value=MAX_LOGPROBS + 1) | st.integers(max_value=-1),
    "top_logprobs": st.integers(min_value=MAX_LOGPROBS + 1) | st.integers(max_value=-1),
    "temperature": odd_floats | huge_ints,
    "top_p": odd_floats | huge_ints,
    "top_k": huge_ints,
    "seed": huge_ints,
    "stop": st.lists(junk, max_size=3),
    "stop_token_ids": token_ids,
    "messages": st.lists(st.dictionaries(st.sampled_from(["role", "content", "name"]), junk), max_size=2),
    "presence_penalty": odd_floats | huge_ints | st.floats(2.0001, 1e9),
    "frequency_penalty": odd_floats | huge_ints | st.floats(-1e9, -2.0001),
    "repetition_penalty": odd_floats | huge_ints | st.floats(max_value=0) | st.floats(10.0001, 1e9),
    "min_tokens": st.integers(max_value=-1) | st.integers(min_value=3) | odd_floats,  # > max_tokens (1-2) too
    "min_p": odd_floats | huge_ints,
    "logit_bias": st.one_of(
        st.dictionaries(st.sampled_from(["x", "1.5", "", "-1", str(VOCAB), str(2**64)]), st.floats(-1, 1), min_size=1),
        st.dictionaries(st.integers(0, VOCAB - 1).map(str), odd_floats | huge_ints, min_size=1, max_size=3),
        st.just({str(i): 0.5 for i in range(MAX_LOGIT_BIAS + 1)}),
    ),
}
COMPLETION_FIELDS = ["prompt", "max_tokens", "n", "logprobs", "prompt_logprobs", "temperature", "top_p", "top_k"]
COMPLETION_FIELDS += ["seed", "stop", "stop_token_ids", "echo", "stream", "stream_options", "best_of", "suffix"]
PENALTY_FIELDS = ["presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "min_p", "logit_bias"]
COMPLETION_FIELDS += PENALTY_FIELDS
CHAT_FIELDS = ["messages", "max_tokens", "max_completion_tokens", "n", "logprobs", "top_logprobs", "temperature"]
CHAT_FIELDS += ["top_p", "top_k", "seed", "stop", "stream", "stream_options", "tools", "response_format"]
CHAT_FIELDS += PENALTY_FIELDS
KNOWN = set(COMPLETION_FIELDS + CHAT_FIELDS + ["model", "user", "stream_options", "ignore_eos", "seed"])
# The fields a 4xx may name when one is changed (logprobs false makes a top_logprobs that is set an error).
RELATED = {"logprobs": {"top_logprobs", "logprobs"}}
LONG = {"prompt": "hi " * (MAX_MODEL_LEN + 10), "messages": [{"role": "user", "content": "hi " * MAX_MODEL_LEN}]}


def valid_completion() -> st.SearchStrategy[dict]:
    prompt = st.text(min_size=1, max_size=12) | st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)
    return st.fixed_dictionaries(
        {"prompt": prompt, "max_tokens": st.integers(1, 2)},
        optional={
            "temperature": st.floats(0, 2),
            "logprobs": st.integers(0, 3),
            "seed": st.integers(0, 2**63 - 1),
            "presence_penalty": st.floats(-2, 2),
            "repetition_penalty": st.floats(0.5, 2),
            "logit_bias": st.dictionaries(st.integers(0, VOCAB - 1).map(str), st.floats(-100, 100), max_size=3),
        },
    )


def valid_chat() -> st.SearchStrategy[dict]:
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=12)})
    return st.fixed_dictionaries(
        {"messages": st.lists(message, min_size=1, max_size=2), "max_tokens": st.integers(1, 2)},
        optional={"temperature": st.floats(0, 2), "top_p": st.floats(0.1, 1), "stop": st.lists(st.text(max_size=3))},
    )


@st.composite
def mutated(draw, valid: st.SearchStrategy[dict], fields: list[str]) -> tuple[dict, set[str] | None]:
    """(body, the fields a 4xx may name) from a valid body: one field set wrong, a required field dropped, or a
    field added (None: a field OpenAI's API does not know, which is ignored)."""
    body = draw(valid)
    kind = draw(st.sampled_from(["bad", "junk", "drop", "extra"]))
    field = draw(st.sampled_from(fields))
    prompt = "prompt" if "prompt" in body else "messages"
    if kind == "drop":
        del body[prompt]
        return body, {prompt}
    if kind == "extra":
        body[draw(st.text(min_size=1, max_size=10).filter(lambda k: k not in KNOWN))] = draw(junk)
        return body, None
    body[field] = draw(BAD[field] if kind == "bad" and field in BAD else junk)
    if field in ("max_tokens", "max_completion_tokens", "n") and type(body[field]) is int and body[field] > 2:
        body[prompt] = LONG[prompt]  # valid, but too slow to run here: a prompt over max_model_len makes it a 400
        return body, {field, prompt}
    return body, RELATED.get(field, {field})


class Checker:
    """Posts bodies, checks each response, and a good request every GOOD_EVERY of them."""

    def __init__(self, http, path: str, good: dict) -> None:
        self.http, self.path, self.good, self.sent = http, path, good, 0

    def post(self, content: bytes) -> tuple[int, object]:
        self.sent += 1
        if self.sent % GOOD_EVERY == 0:
            resp = self.http.post(self.path, json=self.good)
            assert resp.status_code == 200, resp.text
            check_completion(resp.json())
        resp = self.http.post(self.path, content=content, headers={"Content-Type": "application/json"})
        assert resp.status_code < 500, resp.text
        if resp.status_code != 200:
            return resp.status_code, check_error(resp.json(), resp.status_code)
        if resp.headers["content-type"].startswith("text/event-stream"):
            check_stream(resp.text)
        else:
            check_completion(resp.json())
        return 200, None


def check_error(body: dict, status: int) -> str | None:
    """OpenAI's error shape; returns its param."""
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, body
    assert isinstance(error["message"], str) and error["message"] and error["code"] == status
    assert error["param"] is None or (isinstance(error["param"], str) and error["param"]), body
    return error["param"]


def check_completion(body: dict) -> None:
    assert body["choices"], body
    for choice in body["choices"]:
        assert choice["finish_reason"] in ("stop", "length"), body
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        assert isinstance(text, str)
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


def check_stream(text: str) -> None:
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", text
    for event in events[:-1]:
        assert "error" not in json.loads(event), event


def root(param: str) -> str:
    return param.split(".")[0].split("[")[0]


def fuzz_fields(checker: Checker, body: dict, named: set[str] | None) -> None:
    status, param = checker.post(json.dumps(body).encode())
    if status != 200 and named is not None:
        assert status == 400 and param is not None and root(param) in named, (body, param)


@pytest.fixture(scope="module")
def completions(http):
    return Checker(http, "/v1/completions", {"prompt": "Hello", "max_tokens": 1})


@pytest.fixture(scope="module")
def chats(http):
    return Checker(http, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})


@FUZZ
@given(case=mutated(valid_completion(), COMPLETION_FIELDS))
def test_fuzz_completions(completions, case):
    fuzz_fields(completions, *case)


@FUZZ
@given(case=mutated(valid_chat(), CHAT_FIELDS))
def test_fuzz_chat(chats, case):
    fuzz_fields(chats, *case)


raw_bodies = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=40).map(str.encode),
    junk.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
    st.builds(lambda s, cut: s[:cut], st.just(b'{"prompt": "Hello", "max_tokens": 1}'), st.integers(0, 35)),
    st.sampled_from([b"[" * 50000 + b"]" * 50000, b'{"prompt": "\\ud800", "max_tokens": 1}', b'{"\\udc00": 1}']),
)


@FUZZ
@given(content=raw_bodies, path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_fuzz_raw_bodies(completions, chats, content, path):
    """Not a JSON object (or one with an unpaired surrogate): a 400 about the body, or about the field holding it."""
    checker = completions if path == "/v1/completions" else chats
    status, param = checker.post(content)
    assert status == 400, content
    assert param in (None, "prompt", "messages"), (content, param)
