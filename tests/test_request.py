import numpy as np
import torch

from qwen3_runtime import SamplingParams

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def test_bad_requests_fail_alone_whatever_is_wrong_with_them(make_runtime):
    rt = make_runtime()
    negative, no_stops = SamplingParams(temperature=0), SamplingParams(temperature=0)
    negative.max_tokens = -5  # changed after creation: checked again at submission
    no_stops.stop_token_ids = None  # was a TypeError out of generate(), losing the whole batch
    requests = [
        ([3, 4, 5], GREEDY),
        ([3, 4, 5], negative),
        ([3, 4, 5], no_stops),
        (None, GREEDY),
        ("hello", GREEDY),
        (np.array([3, 4, 5]), GREEDY),
        (torch.tensor([3, 4, 5]), GREEDY),
        ([np.int64(3), np.int32(4), 5], GREEDY),
    ]
    outs = rt.generate([prompt for prompt, _ in requests], [params for _, params in requests])
    errors = [out.error for out in outs]
    assert errors == [
        None,
        "max_tokens=-5 is out of range: must be >= 1",
        "stop_token_ids=None is invalid: expected a list of token ids, got NoneType",
        "prompt=None is invalid: expected a list of token ids, got NoneType",
        "prompt='hello' is invalid: expected a list of token ids, got str",
        "prompt=array([3, 4, 5]) is invalid: expected a list of token ids, got ndarray",
        "prompt=tensor([3, 4, 5]) is invalid: expected a list of token ids, got Tensor",
        None,
    ]
    assert outs[7].token_ids == outs[0].token_ids and len(outs[0].token_ids) == 4
    assert outs[7].prompt_token_ids == [3, 4, 5] and all(type(t) is int for t in outs[7].prompt_token_ids)
    assert [out.prompt_token_ids for out in outs[1:7]] == [[3, 4, 5]] * 2 + [[]] * 4
    assert all(out.token_ids == [] and out.finish_reason == "error" for out in outs[1:7])
