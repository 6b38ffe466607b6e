import numpy as np
import pytest

from qwen3_runtime import SamplingParams


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
