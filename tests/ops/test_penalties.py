"""The penalties kernel (Triton in the interpreter on the CPU) against its PyTorch reference, and the reference
against vLLM's semantics written out per token in plain Python (float32 arithmetic through NumPy scalars)."""

import numpy as np
import pytest
import torch

from qwen3_runtime.ops import penalties
from qwen3_runtime.ops.penalties import CHUNK, PenaltyRows, SlotState, apply_penalties, apply_penalties_reference
from qwen3_runtime.params import MAX_LOGIT_BIAS

NUM_STOP = 3  # not a power of two: the kernel pads the load
MAX_BIAS = MAX_LOGIT_BIAS  # the runtime's table width


def _bias(vocab: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Slot 0: no bias; slot 1: a few, on the edge tokens (-inf, 0, a stop id, seen ones, the last id); slot 2:
    all but 9 of the runtime's 1,024 (eight rounds of BLOCK_BIAS, the last partial) or the whole vocabulary, over
    every chunk (in random order, +-100 among them); slot 3: one. Unused entries hold junk."""
    num = torch.tensor([0, 6, min(MAX_BIAS - 9, vocab), 1], dtype=torch.int32)
    ids = torch.randint(0, vocab, (4, MAX_BIAS), generator=g, dtype=torch.int32)
    values = torch.randn(4, MAX_BIAS, generator=g) * 30
    ids[1, :6] = torch.tensor([1, 2, 0, 4, 5, vocab - 1], dtype=torch.int32)
    ids[2, : num[2]] = torch.randperm(vocab, generator=g)[: num[2]].to(torch.int32)
    values[2, :2] = torch.tensor([100.0, -100.0])
    ids[3, 0] = 3
    return num, ids, values


def _inputs(vocab: int, seed: int) -> dict:
    """Eight rows over four slots (one unused): every edge case of the module docstring."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(8, vocab, generator=g) * 5  # negative and positive
    logits[:, 1] = float("-inf")
    logits[:, 2] = 0.0
    counts = torch.randint(0, 4, (4, vocab), generator=g, dtype=torch.int32) * (torch.rand(4, vocab, generator=g) < 0.2)
    counts[:, 3] = 0  # never generated ...
    counts[:, 4] = 1
    counts[:, 5] = 40  # ... once, many times
    prompt_mask = (torch.rand(4, vocab, generator=g) < 0.2).to(torch.uint8)
    prompt_mask[:, 3] = 1  # in the prompt only
    prompt_mask[:, 4] = 0  # in the output only
    prompt_mask[:, 5] = 1  # in both
    stop_ids = torch.full((4, NUM_STOP), -1, dtype=torch.int32)
    stop_ids[:, :2] = torch.tensor([0, 4], dtype=torch.int32)
    stop_ids[3, 2] = vocab - 1
    stop_ids[2, 2] = 1
    f32 = lambda *v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    state = SlotState(counts, prompt_mask, stop_ids, *_bias(vocab, g))
    return dict(
        logits=logits,
        per_row=PenaltyRows(
            slot=torch.tensor([0, -1, 1, 2, -1, 0, 3, 2], dtype=torch.int64),
            presence=f32(0.5, 2.0, -1.5, 0.0, 0.0, 2.0, 0.3, 0.0),
            frequency=f32(0.25, 1.0, 0.0, -2.0, 0.0, -0.7, 0.1, 0.0),
            repetition=f32(1.3, 2.0, 0.7, 1.0, 1.0, 1.0, 9.5, 1.0),
            suppress_stop=torch.tensor([1, 1, 0, 1, 0, 0, 1, 0], dtype=torch.int64),
        ),
        state=state,
    )


def _vllm_row(x, counts, prompt, stops, bias, presence, frequency, repetition, suppress) -> list:
    """vLLM V1's logit bias, then its penalties, on one row, token by token."""
    r, f, p = np.float32(repetition), np.float32(frequency), np.float32(presence)
    out = []
    for t, logit in enumerate(x):
        y, c = np.float32(logit), int(counts[t])
        if t in bias:
            y = y + np.float32(bias[t])
        if prompt[t] or c > 0:
            y = y / r if y > 0 else y * r
        y = y - f * np.float32(c)
        y = y - p * np.float32(c > 0)
        if suppress and t in stops:
            y = np.float32("-inf")
        out.append(float(y))
    return out


def _vllm(inp: dict) -> torch.Tensor:
    rows, state = [], inp["state"]
    for i, slot in enumerate(inp["per_row"].slot.tolist()):
        if slot < 0:
            rows.append(inp["logits"][i].tolist())
            continue
        n = state.num_bias[slot]
        rows.append(
            _vllm_row(
                inp["logits"][i].tolist(),
                state.output_counts[slot].tolist(),
                state.prompt_mask[slot].tolist(),
                {s for s in state.stop_ids[slot].tolist() if s >= 0},
                dict(zip(state.bias_ids[slot, :n].tolist(), state.bias_values[slot, :n].tolist())),
                *(t[i].item() for t in inp["per_row"][1:]),  # presence, frequency, repetition, suppress_stop
            )
        )
    return torch.tensor(rows, dtype=torch.float32)


def _exact(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("vocab", [37, CHUNK + 5])
def test_reference_follows_vllm_semantics(vocab):
    inp = _inputs(vocab, seed=vocab)
    _exact(apply_penalties_reference(**inp), _vllm(inp))


@pytest.mark.parametrize("vocab", [37, CHUNK, 2 * CHUNK + 99, 151_936])  # the last: Qwen3's
def test_kernel_matches_the_reference(vocab):
    inp = _inputs(vocab, seed=vocab + 1)
    poisoned = torch.full_like(inp["logits"], float("nan"))  # unwritten elements stay NaN
    out = apply_penalties(**inp, out=poisoned)
    assert out is poisoned
    ref = apply_penalties_reference(**inp)
    _exact(out, ref)
    held = inp["per_row"].slot >= 0
    assert torch.equal(out[~held].view(torch.int32), inp["logits"][~held].view(torch.int32))  # bit for bit
    assert not torch.equal(out[held], inp["logits"][held])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("vocab", [CHUNK + 5, 151_936])
def test_kernel_matches_the_reference_on_gpu(vocab):
    """Compiled for the GPU, whose barrier between a chunk's store and its biased tokens' rewrite is the hardware's:
    every row exact against the reference, and the flagged rows written over their logits as well."""
    inp = _inputs(vocab, seed=vocab + 2)
    inp = {k: type(v)(*(t.cuda() for t in v)) if isinstance(v, tuple) else v.cuda() for k, v in inp.items()}
    raw, write_rows = inp["logits"].clone(), torch.tensor([1, 0, 1, 1, 0, 0, 1, 0], dtype=torch.int32, device="cuda")
    out = apply_penalties(**inp, out=torch.full_like(raw, float("nan")), write_rows=write_rows)
    ref = apply_penalties_reference(**{**inp, "logits": raw})
    _exact(out, ref)
    flagged = write_rows != 0
    _exact(inp["logits"][flagged], ref[flagged])
    assert torch.equal(inp["logits"][~flagged].view(torch.int32), raw[~flagged].view(torch.int32))


@pytest.mark.parametrize("kernel", [True, False])
def test_flagged_rows_are_also_written_over_the_logits(monkeypatch, kernel):
    """write_rows: those rows' penalized values go over their logits too (a held and an unheld row among them);
    the other rows' logits stay raw, bit for bit."""
    inp = _inputs(CHUNK + 5, seed=11)
    raw = inp["logits"].clone()
    write_rows = torch.tensor([1, 1, 0, 0, 1, 0, 0, 1], dtype=torch.int32)
    if not kernel:
        monkeypatch.setattr(penalties, "use_triton", lambda t: False)

    out = apply_penalties(**inp, write_rows=write_rows)

    flagged = write_rows != 0
    _exact(out, apply_penalties_reference(**{**inp, "logits": raw}))
    _exact(inp["logits"][flagged], out[flagged])
    assert torch.equal(inp["logits"][~flagged].view(torch.int32), raw[~flagged].view(torch.int32))


def test_edge_cases_do_what_they_say():
    inp = _inputs(37, seed=3)
    out = apply_penalties_reference(**inp)
    x = inp["logits"]
    assert out[0, 0] == float("-inf") and out[0, 4] == float("-inf")  # suppressed stop ids
    assert out[:, 1].eq(float("-inf")).all()  # -inf stays -inf through every penalty
    state = inp["state"]
    # Row 3 (slot 2): no repetition, frequency -2 and no presence: a token seen 40 times gains 80 (and its bias);
    # one in the prompt only keeps its logit (and its bias).
    bias = dict(zip(state.bias_ids[2].tolist(), state.bias_values[2, : state.num_bias[2]].tolist()))
    assert out[3, 5] == x[3, 5] + bias.get(5, 0.0) + 80 and out[3, 3] == x[3, 3] + bias.get(3, 0.0)
    # Row 6 (slot 3): repetition 9.5 > 1 pulls a seen positive logit towards 0 and pushes a negative one away.
    seen = (state.prompt_mask[3] != 0) & (state.output_counts[3] == 0)
    seen[state.stop_ids[3].long()] = False
    seen[3] = False  # biased
    for t in seen.nonzero().flatten().tolist():
        assert abs(out[6, t]) <= abs(x[6, t]) if x[6, t] > 0 else abs(out[6, t]) >= abs(x[6, t])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy (the interpreter's and _vllm_row's) overflows
@pytest.mark.parametrize("vocab", [37, CHUNK + 5])
def test_huge_and_masked_rows_match_the_reference(vocab):
    """Rows of +-3e38 (repetition's division and product, the bias and the frequency term may overflow to +-inf,
    in the kernel as in PyTorch) and rows entirely -inf (masked; a +100 bias leaves -inf as it is), through every
    slot, into a poisoned output; the reference against vLLM's per-token semantics too."""
    inp = _inputs(vocab, seed=vocab + 3)
    g = torch.Generator().manual_seed(vocab)
    logits = inp["logits"]
    for row in (0, 2, 6, 7):
        logits[row] = (torch.rand(vocab, generator=g) * 2 - 1) * 3.4e38
    logits[3] = float("-inf")  # slot 2: +-100 among its biases
    logits[5] = float("-inf")
    out = apply_penalties(**inp, out=torch.full_like(logits, float("nan")))
    ref = apply_penalties_reference(**inp)
    _exact(out, ref)
    _exact(ref, _vllm(inp))
    assert out[[3, 5]].eq(float("-inf")).all() and out[[0, 2, 6]].isinf().any()
