import dataclasses
import json
import math
import pickle

import numpy as np
import pytest
import torch

from qwen3_runtime import SamplingParams, packed_rows
from qwen3_runtime.logprobs import TokenLogprob
from qwen3_runtime.packed_rows import PackedLogprobs, StepLogprobs, packed_width, plain_logprobs
from qwen3_runtime.request import RequestOutput, RequestUpdate

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
_unpack = packed_rows.unpack_rows


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
        ({"role": "user"}, GREEDY),
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
        "prompt={'role': 'user'} is invalid: expected a list of token ids, got dict",
        "prompt=array([3, 4, 5]) is invalid: expected a list of token ids, got ndarray",
        "prompt=tensor([3, 4, 5]) is invalid: expected a list of token ids, got Tensor",
        None,
    ]
    assert outs[7].token_ids == outs[0].token_ids and len(outs[0].token_ids) == 4
    assert outs[7].prompt_token_ids == [3, 4, 5] and all(type(t) is int for t in outs[7].prompt_token_ids)
    assert [out.prompt_token_ids for out in outs[1:7]] == [[3, 4, 5]] * 2 + [[]] * 4
    assert all(out.token_ids == [] and out.finish_reason == "error" for out in outs[1:7])


def _rows(n: int, k: int) -> np.ndarray:
    """Packed rows as a step copies them back: every other one failed (status 1), -inf top logprobs."""
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 1000, (n, packed_width(k)), dtype=np.int32)
    rows[:, 1] = np.arange(n) % 2
    floats = -rng.random((n, 2 + k), dtype=np.float32) * 9
    floats[:, -1] = -np.inf
    rows[:, [2, 4, *range(5 + k, 5 + 2 * k)]] = floats.view(np.int32)
    return rows


def test_lazy_logprobs_become_plain_lists_in_one_bulk_unpack(monkeypatch):
    rows, calls = _rows(6, 3), []
    monkeypatch.setattr(packed_rows, "unpack_rows", lambda *a: calls.append(a) or _unpack(*a))
    prompt = PackedLogprobs(rows, 2, leading=1)
    step = StepLogprobs(3)
    for i, row in enumerate(rows[:4]):
        step.append(row.copy() if i != 2 else _unpack(rows[2:3], 3)[0])
    for lazy in (prompt, step):
        calls.clear()
        plain = plain_logprobs(lazy)
        assert len(calls) == 1  # all packed rows at once, not one call per entry
        assert type(plain) is list and plain == [lazy[i] for i in range(len(lazy))]
    assert plain_logprobs(None) is None and plain_logprobs(PackedLogprobs(rows[:0], 2, leading=1)) == [None]
    assert plain_logprobs([None, plain[0]]) == [None, plain[0]]


@pytest.mark.parametrize("path, mode", [("device", "processed"), ("host", "raw")])
def test_outputs_are_plain_data_that_json_round_trips(make_runtime, path, mode):
    rt = make_runtime(logprobs__path=path)
    params = SamplingParams(
        max_tokens=3, temperature=0.8, top_k=2, seed=1, ignore_eos=True, logprobs=4, prompt_logprobs=3
    )
    params.logprobs_mode = mode
    out = rt.generate([[5, 6, 7, 8]], params)[0]
    assert out.error is None and len(out.logprobs) == 3 and len(out.prompt_logprobs) == 4
    assert all(type(e) is TokenLogprob for e in out.logprobs + out.prompt_logprobs[1:])
    assert [e.token_id for e in out.logprobs] == out.token_ids
    assert [e.token_id for e in out.prompt_logprobs[1:]] == [6, 7, 8] and out.prompt_logprobs[0] is None
    data = dataclasses.asdict(out)
    assert json.loads(json.dumps(data)) == data
    assert data["logprobs"][0]["top_logprobs"] == out.logprobs[0].top_logprobs and len(data["logprobs"]) == 3
    top = [v for e in out.logprobs for v in e.top_logprobs]
    assert any(math.isinf(v) for v in top) == (mode == "processed")  # top-k 2 of 4: -inf, written -Infinity


def test_outputs_keep_logprobs_packed_until_read(make_runtime):
    """The step that finishes a request builds no TokenLogprob: its output holds the packed rows, pickles them
    packed, and builds plain lists when they are first read (once)."""
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=2, prompt_logprobs=2)
    out = make_runtime().generate([[5, 6, 7, 8]], params)[0]
    stored = lambda o, name: RequestOutput.__dict__[name].stored(o)  # noqa: E731
    assert type(stored(out, "logprobs")) is StepLogprobs and type(stored(out, "prompt_logprobs")) is PackedLogprobs
    back = pickle.loads(pickle.dumps(out))
    assert type(stored(back, "prompt_logprobs")) is PackedLogprobs
    assert type(out.prompt_logprobs) is list and out.prompt_logprobs is out.prompt_logprobs
    assert stored(out, "prompt_logprobs") is out.prompt_logprobs and type(out.logprobs[0]) is TokenLogprob
    assert back == out and len(out.prompt_logprobs) == 4 and out.prompt_logprobs[0] is None


def test_updates_and_logprobs_pickle_to_equal_objects():
    """The engine process pickles them to the API process every step, by their own __reduce__."""
    lp = TokenLogprob(7, -0.5, 2, 1.25, [3, 7], [-0.25, -0.5])
    update = RequestUpdate("req-1", [7], [lp], [None, lp], "stop", "why", 4)
    back = pickle.loads(pickle.dumps(update))
    assert back == update and dataclasses.fields(back) == dataclasses.fields(update)
    assert type(back.logprobs[0]) is TokenLogprob and back.logprobs[0] == lp
    rows = np.zeros((2, packed_width(2)), dtype=np.int32)
    packed = RequestUpdate("req-2", [7], None, PackedLogprobs(rows, 2, leading=1), None, None, 3)
    back = pickle.loads(pickle.dumps(packed))  # the prompt's logprobs travel packed, built when read
    assert type(RequestUpdate.__dict__["prompt_logprobs"].stored(back)) is PackedLogprobs
    assert back == packed and len(back.prompt_logprobs) == 3 and type(back.prompt_logprobs[1]) is TokenLogprob
