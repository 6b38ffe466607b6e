from dataclasses import replace

import numpy as np
import pytest
import torch

from qwen3_runtime import SamplingParams
from qwen3_runtime.params import RequestLimits, check_request
from qwen3_runtime.sampler import GREEDY_BELOW, SamplingTensors, random_rows


def test_defaults_follow_vllm():
    p = SamplingParams()
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.seed, p.logprobs) == (16, 1.0, -1, 1.0, None, None)
    assert SamplingParams(temperature=0).greedy


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"max_tokens": 0}, ["max_tokens=0", ">= 1"]),
        ({"max_tokens": 2.5}, ["max_tokens=2.5", "integer"]),
        ({"temperature": -0.1}, ["temperature=-0.1", ">= 0"]),
        ({"temperature": float("nan")}, ["temperature=nan", "number"]),
        ({"top_p": 0.0}, ["top_p=0.0", "(0, 1]"]),
        ({"top_p": 1.5}, ["top_p=1.5", "(0, 1]"]),
        ({"top_k": -2}, ["top_k=-2", ">= -1"]),
        ({"seed": -1}, ["seed=-1", "[0, "]),
        ({"logprobs": -2}, ["logprobs=-2", ">= -1"]),
        ({"logprobs": 1.0}, ["logprobs=1.0", "integer"]),
        ({"prompt_logprobs": True}, ["prompt_logprobs=True", "integer"]),
        ({"stop_token_ids": [1, -5]}, ["stop_token_ids[1]=-5"]),
        ({"ignore_eos": 1}, ["ignore_eos=1"]),
        ({"logprobs_mode": "softmax"}, ["logprobs_mode='softmax'", "raw, processed"]),
        ({"presence_penalty": 2.5}, ["presence_penalty=2.5", "[-2, 2]"]),
        ({"presence_penalty": "1"}, ["presence_penalty='1'", "a number"]),
        ({"frequency_penalty": -2.01}, ["frequency_penalty=-2.01", "[-2, 2]"]),
        ({"frequency_penalty": float("inf")}, ["frequency_penalty=inf", "finite"]),
        ({"repetition_penalty": 0.0}, ["repetition_penalty=0.0", "(0, 10.0]"]),
        ({"repetition_penalty": 11}, ["repetition_penalty=11.0", "(0, 10.0]"]),
        ({"min_tokens": -1}, ["min_tokens=-1", "[0, 16]"]),
        ({"min_tokens": 17}, ["min_tokens=17", "[0, 16]", "max_tokens=16"]),
        ({"min_tokens": 2.0}, ["min_tokens=2.0", "integer"]),
        ({"min_p": 1.5}, ["min_p=1.5", "[0, 1]"]),
        ({"min_p": -0.1}, ["min_p=-0.1", "[0, 1]"]),
    ],
)
def test_bad_values_name_the_field(kwargs, words):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"temperature": float("nan")}, "temperature=nan is invalid: expected a finite number"),
        ({"temperature": float("inf")}, "temperature=inf is invalid: expected a finite number"),
        ({"top_p": float("nan")}, "top_p=nan is invalid: expected a finite number"),
        ({"top_p": np.float32("inf")}, "top_p=inf is invalid: expected a finite number"),
        ({"top_p": 1.5}, "top_p=1.5 is out of range: must be in (0, 1]"),
        ({"temperature": -1}, "temperature=-1.0 is out of range: must be >= 0 (0 is greedy)"),
        ({"max_tokens": True}, "max_tokens=True is invalid: expected an integer"),
        ({"top_k": np.float64(5)}, "top_k=np.float64(5.0) is invalid: expected an integer"),
        ({"stop_token_ids": None}, "stop_token_ids=None is invalid: expected a list of token ids, got NoneType"),
        ({"stop_token_ids": [np.float32(3)]}, "stop_token_ids[0]=np.float32(3.0) is invalid: expected an integer"),
        ({"logit_bias": [5]}, "logit_bias=[5] is invalid: expected a dict of token id -> bias, got list"),
        ({"logit_bias": {"5": 1}}, "logit_bias key='5' is invalid: expected an integer"),
        ({"logit_bias": {-1: 1}}, "logit_bias key=-1 is out of range: must be >= 0 (a token id)"),
        ({"logit_bias": {5: 100.5}}, "logit_bias[5]=100.5 is out of range: must be in [-100.0, 100.0]"),
        ({"logit_bias": {5: float("-inf")}}, "logit_bias[5]=-inf is invalid: expected a finite number"),
        ({"logit_bias": dict.fromkeys(range(1025), 1)}, "logit_bias names 1025 tokens: at most 1024 are supported"),
    ],
)
def test_non_finite_and_wrong_types_are_rejected_with_one_message_shape(kwargs, text):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert str(err.value) == text


def test_numpy_scalars_are_accepted_as_python_numbers():
    p = SamplingParams(
        max_tokens=np.int64(4),
        temperature=np.float32(0.5),
        top_k=np.int32(3),
        top_p=np.float32(0.25),
        seed=np.uint32(7),
        stop_token_ids=(np.int64(2), 5),
        ignore_eos=np.bool_(True),
        logprobs=np.int8(2),
        prompt_logprobs=np.int16(1),
    )
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.seed) == (4, 0.5, 3, 0.25, 7)
    assert (p.stop_token_ids, p.ignore_eos, p.logprobs, p.prompt_logprobs) == ([2, 5], True, 2, 1)
    values = [p.max_tokens, p.temperature, p.top_k, p.top_p, p.seed, p.ignore_eos, p.logprobs, p.prompt_logprobs]
    assert [type(v) for v in values] == [int, float, int, float, int, bool, int, int]
    assert all(type(t) is int for t in p.stop_token_ids)
    assert SamplingParams(temperature=1).temperature == 1.0 and type(SamplingParams(temperature=1).temperature) is float


LIMITS = RequestLimits(vocab_size=512, max_model_len=64, max_logprobs=20)


@pytest.mark.parametrize(
    "prompt, text",
    [
        (None, "prompt=None is invalid: expected a list of token ids, got NoneType"),
        ("hello", "prompt='hello' is invalid: expected a list of token ids, got str"),
        (np.array([1, 2]), "prompt=array([1, 2]) is invalid: expected a list of token ids, got ndarray"),
        (torch.tensor([1, 2]), "prompt=tensor([1, 2]) is invalid: expected a list of token ids, got Tensor"),
        ([1, True], "prompt[1]=True is invalid: expected an integer"),
        ([1, 2.0], "prompt[1]=2.0 is invalid: expected an integer"),
        ([1, 512], "prompt[1]=512 is out of range: must be in [0, 512)"),
        ([], "prompt is empty: a request needs at least one prompt token id"),
        (
            [1] * 64,
            "prompt has 64 tokens: it must be shorter than engine.max_model_len=64, which counts the generated "
            "tokens too",
        ),
    ],
)
def test_wrong_prompts_are_named_accurately(prompt, text):
    with pytest.raises(ValueError) as err:
        check_request(prompt, SamplingParams(), LIMITS)
    assert str(err.value) == text


def test_a_numpy_integer_prompt_is_a_list_of_ints():
    prompt, _ = check_request((np.int64(1), np.int32(511)), SamplingParams(), LIMITS)
    assert prompt == [1, 511] and all(type(t) is int for t in prompt)


@pytest.mark.parametrize(
    "field, value, text",
    [
        ("max_tokens", -5, "max_tokens=-5 is out of range: must be >= 1"),
        ("stop_token_ids", None, "stop_token_ids=None is invalid: expected a list of token ids, got NoneType"),
        ("temperature", float("nan"), "temperature=nan is invalid: expected a finite number"),
        ("logprobs_mode", "softmax", "logprobs_mode='softmax' is invalid: allowed values are raw, processed"),
        ("seed", "1", "seed='1' is invalid: expected an integer"),
    ],
)
def test_fields_changed_after_creation_are_checked_at_submission(field, value, text):
    params = SamplingParams()
    setattr(params, field, value)  # a mutable dataclass, as vLLM's
    with pytest.raises(ValueError) as err:
        check_request([1, 2], params, LIMITS)
    assert str(err.value) == text


def test_submission_checks_the_model_limits_and_returns_a_checked_copy():
    with pytest.raises(ValueError, match=r"^stop_token_ids\[0\]=512 is out of range: must be in \[0, 512\)$"):
        check_request([1], SamplingParams(stop_token_ids=[512]), LIMITS)
    with pytest.raises(ValueError, match=r"^logprobs=21 is out of range: must be in \[0, 20\] \(logprobs.max_logprobs"):
        check_request([1], SamplingParams(logprobs=21), LIMITS)
    whole = RequestLimits(vocab_size=512, max_model_len=64, max_logprobs=-1)
    assert check_request([1], SamplingParams(prompt_logprobs=-1), whole)[1].prompt_logprobs == -1
    with pytest.raises(ValueError, match=r"^prompt_logprobs=513 is out of range: must be in \[-1, 512\]"):
        check_request([1], SamplingParams(prompt_logprobs=513), whole)
    roomy = RequestLimits(vocab_size=512, max_model_len=64, max_logprobs=100_000)  # the vocabulary binds first
    with pytest.raises(ValueError, match=r"^logprobs=513 is out of range: must be in \[0, 512\] \(the vocabulary's"):
        check_request([1], SamplingParams(logprobs=513), roomy)
    with pytest.raises(ValueError, match=r"^params='greedy' is invalid: expected SamplingParams$"):
        check_request([1], "greedy", LIMITS)
    mine = SamplingParams(stop_token_ids=[3])
    mine.max_tokens = np.int64(5)
    _, params = check_request([1], mine, LIMITS)
    assert params == SamplingParams(max_tokens=5, stop_token_ids=[3]) and type(params.max_tokens) is int
    mine.stop_token_ids.append(4)  # later changes to the caller's object do not reach the request
    assert params is not mine and params.stop_token_ids == [3]
    with pytest.raises(ValueError, match=r"^logit_bias key=512 is out of range: must be in \[0, 512\) \(a token id"):
        check_request([1], SamplingParams(logit_bias={3: 1.0, 512: -1.0}), LIMITS)
    mine = SamplingParams(logit_bias={np.int64(3): np.float32(-2.5)})
    _, params = check_request([1], mine, LIMITS)
    mine.logit_bias[4] = 1.0
    assert params.logit_bias == {3: -2.5} and [type(v) for kv in params.logit_bias.items() for v in kv] == [int, float]


def test_penalized_and_its_defaults():
    p = SamplingParams()
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_tokens, p.min_p) == (0, 0, 1, 0, 0)
    assert not p.penalized and not SamplingParams(min_p=0.5).penalized
    for field in ({"presence_penalty": -0.5}, {"frequency_penalty": 0.1}, {"repetition_penalty": 0.9}):
        assert SamplingParams(**field).penalized
    assert SamplingParams(min_tokens=1).penalized and SamplingParams(min_tokens=16, max_tokens=16).min_tokens == 16
    assert SamplingParams(logit_bias={3: 0.5}).penalized and not SamplingParams(logit_bias={}).penalized


def test_min_tokens_suppresses_stop_and_eos_ids_up_to_a_limit():
    limits = RequestLimits(vocab_size=512, max_model_len=64, max_logprobs=20, eos_token_ids=(7, 9))
    params = SamplingParams(min_tokens=2, stop_token_ids=[3, 7])
    assert params.min_tokens_stop_ids(limits.eos_token_ids) == [3, 7, 9]
    assert SamplingParams(min_tokens=2, stop_token_ids=[3], ignore_eos=True).min_tokens_stop_ids((7,)) == [3]
    assert SamplingParams(stop_token_ids=[3]).min_tokens_stop_ids((7,)) == []  # no min_tokens: nothing to suppress
    check_request([1], SamplingParams(min_tokens=2, stop_token_ids=list(range(100, 130))), limits)  # 32: the limit
    too_many = SamplingParams(min_tokens=2, stop_token_ids=list(range(100, 131)))
    with pytest.raises(ValueError, match=r"^min_tokens=2 suppresses 33 stop and EOS token ids: at most 32"):
        check_request([1], too_many, limits)
    check_request([1], replace(too_many, ignore_eos=True), limits)
    check_request([1], replace(too_many, min_tokens=0), limits)


def test_top_k_at_or_above_the_vocabulary_is_off():
    """A huge top_k keeps every token, as -1 does; left as it was it overflowed the step's int64 table."""
    for top_k in (512, 10**30):
        assert check_request([1], SamplingParams(top_k=top_k), LIMITS)[1].top_k == -1
    assert check_request([1], SamplingParams(top_k=511), LIMITS)[1].top_k == 511


def test_greedy_is_decided_in_float32_as_on_the_device():
    """A temperature just under the threshold in float64 rounds to it in float32, where the sampler compares."""
    for t in (0.0, float(np.nextafter(GREEDY_BELOW, 0)), GREEDY_BELOW, 0.5):
        device_random = random_rows(SamplingTensors(torch.tensor([t]), *[torch.zeros(1)] * 5)).item()
        assert SamplingParams(temperature=t).greedy is (not device_random), t
