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
