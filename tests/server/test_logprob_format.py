"""-inf logprobs as -9999.0 (OpenAI's convention); NaN or +inf never reaches JSON."""

import math

import pytest

from qwen3_runtime.logprobs import TokenLogprob
from qwen3_runtime.server.errors import APIError
from qwen3_runtime.server.logprob_format import chat_logprobs, completion_logprobs, finite
from qwen3_runtime.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.builtin_qwen3()


def test_neg_inf_is_minus_9999_and_nan_fails():
    assert finite(-math.inf) == -9999.0 and finite(-1.5) == -1.5
    for bad in (math.nan, math.inf):
        with pytest.raises(APIError) as info:
            finite(bad)
        assert info.value.status == 500


def test_shapes(tok):
    a, b = tok.encode("hi there")
    lp = TokenLogprob(b, -math.inf, 5, 0.0, [a, b], [-0.1, -math.inf])
    comp = completion_logprobs(tok, [a, b], [None, lp], [0, 2])
    assert comp["token_logprobs"] == [None, -9999.0] and comp["top_logprobs"][0] is None
    assert comp["tokens"] == ["hi", " there"] and comp["text_offset"] == [0, 2]
    assert list(comp["top_logprobs"][1].items()) == [(" there", -9999.0), ("hi", -0.1)]  # the token first, then top k
    unranked = TokenLogprob(b, -3.0, 9, 0.0, [a], [-0.2])  # outside the top k: k + 1 entries
    assert completion_logprobs(tok, [b], [unranked], [0])["top_logprobs"] == [{" there": -3.0, "hi": -0.2}]
    (entry,) = chat_logprobs(tok, [a, b], [None, lp])["content"]
    assert entry["token"] == " there" and entry["bytes"] == list(b" there") and entry["logprob"] == -9999.0
    assert [t["token"] for t in entry["top_logprobs"]] == ["hi", " there"]
