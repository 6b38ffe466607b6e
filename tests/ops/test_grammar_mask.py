"""The grammar mask kernel (Triton in the interpreter on the CPU) against its PyTorch reference, the reference
against the bits read one by one, and the kernel on a real xgrammar bitmask over Qwen3's 151,936 ids."""

import pytest
import torch

from qwen3_runtime.ops.grammar_mask import CHUNK, apply_grammar_mask, apply_grammar_mask_reference
from tests.conftest import edge_rows

INF = float("inf")


def _bitmask(rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Random words (bits past the vocabulary set at random too), then an all-zero row, an all-ones row and a row
    allowing one token: the last id."""
    words = -(-vocab // 32) + 2  # wider than needed, as a buffer for a larger vocabulary would be
    bitmask = torch.randint(-(2**31), 2**31, (rows, words), generator=gen, dtype=torch.int64).to(torch.int32)
    bitmask[1], bitmask[2], bitmask[3] = 0, -1, 0
    bitmask[3, (vocab - 1) // 32] = 1 << ((vocab - 1) % 32) if (vocab - 1) % 32 != 31 else -(2**31)
    return bitmask


def _poisoned_logits(vocab: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, logits): the edge rows twice (ties, -inf, signed zeros, huge), a NaN row, in a buffer wider than
    the vocabulary whose extra columns are NaN: a write past the vocabulary shows."""
    rows = [*edge_rows(vocab, gen), *edge_rows(vocab, gen), torch.full((vocab,), float("nan"))]
    buffer = torch.full((len(rows), vocab + 5), float("nan"))
    buffer[:, :vocab] = torch.stack(rows)
    return buffer, buffer[:, :vocab]


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 1000, CHUNK + 37])
def test_kernel_matches_reference(vocab):
    gen = torch.Generator().manual_seed(vocab)
    bitmask = _bitmask(6, vocab, gen)
    buffer, logits = _poisoned_logits(vocab, gen)
    # unmasked rows (-1, -7), rows sharing a bitmask row, the all-zero, all-ones and one-token rows
    mask_row = torch.tensor([0, -1, 1, 2, 3, 0, 5, -7, 4, 4, 1], dtype=torch.int32)
    expected = buffer.clone()
    apply_grammar_mask_reference(expected[:, :vocab], bitmask, mask_row)
    apply_grammar_mask(logits, bitmask, mask_row)
    torch.testing.assert_close(buffer, expected, rtol=0, atol=0, equal_nan=True)


def test_reference_reads_each_bit():
    gen = torch.Generator().manual_seed(1)
    vocab = 70
    bitmask = _bitmask(6, vocab, gen)
    logits = torch.randn(6, vocab, generator=gen)
    logits[:, 5] = -INF  # stays -inf whatever its bit
    mask_row = torch.arange(6, dtype=torch.int64)
    masked = logits.clone()
    apply_grammar_mask_reference(masked, bitmask, mask_row)
    for row in range(6):
        for t in range(vocab):
            bit = (int(bitmask[row, t // 32]) >> (t % 32)) & 1
            assert masked[row, t] == (logits[row, t] if bit else -INF), (row, t)
    assert (masked[1] == -INF).all() and torch.equal(masked[2], logits[2])  # all zeros; all ones
    assert torch.isfinite(masked[3]).nonzero().flatten().tolist() == [vocab - 1]


def test_no_rows():
    apply_grammar_mask(torch.empty(0, 40), torch.empty(0, 2, dtype=torch.int32), torch.empty(0, dtype=torch.int32))


def test_a_real_bitmask_over_qwen3s_vocabulary():
    """xgrammar's mask for the first token of a JSON schema ('{' or '{"') and for a token inside a string: the
    kernel keeps exactly the allowed logits, and never the padded ids past the tokenizer."""
    pytest.importorskip("xgrammar")
    from qwen3_runtime.structured.compiler import ConstraintCompiler
    from qwen3_runtime.structured.matcher import ConstraintMatcher, HostBitmask
    from qwen3_runtime.structured.spec import OutputConstraint
    from qwen3_runtime.tokenizer import Tokenizer

    vocab, tok = 151936, Tokenizer.builtin_qwen3()
    compiler = ConstraintCompiler(tok, vocab, [151645, 151643])
    grammar = compiler.compile(
        OutputConstraint.json_schema({"properties": {"a": {"type": "string"}}, "required": ["a"]})
    )
    compiler.close()
    start, inside = ConstraintMatcher(grammar), ConstraintMatcher(grammar)
    assert all(inside.accept(i) for i in tok.encode('{"a": "x'))
    bitmask = HostBitmask.allocate(2, vocab, pin=False)
    bitmask.fill([1, 0], [start, inside])
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, vocab, generator=gen) + 50
    masked = logits.clone()
    apply_grammar_mask(masked, bitmask.tensor, torch.tensor([1, -1, 0], dtype=torch.int32))
    assert torch.isfinite(masked[0]).nonzero().flatten().tolist() == [90, 4913]  # '{', '{"'
    assert torch.equal(masked[1], logits[1])
    kept = torch.isfinite(masked[2])
    assert 100_000 < kept.sum() < tok.vocab_size and not kept[tok.vocab_size :].any()
    assert torch.equal(masked[2][kept], logits[2][kept])
    expected = logits.clone()
    apply_grammar_mask_reference(expected, bitmask.tensor, torch.tensor([1, -1, 0]))
    assert torch.equal(masked, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_replays_in_a_cuda_graph_with_new_masks():
    gen = torch.Generator().manual_seed(0)
    vocab, rows = 151936, 32
    bitmask = torch.empty(rows, vocab // 32, dtype=torch.int32, device="cuda")
    mask_row = torch.empty(rows, dtype=torch.int32, device="cuda")
    logits = torch.empty(rows, vocab, device="cuda")
    source = torch.randn(rows, vocab, generator=gen).cuda()

    def step():
        logits.copy_(source)
        apply_grammar_mask(logits, bitmask, mask_row)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in range(3):
        host = _bitmask(rows, vocab, torch.Generator().manual_seed(seed))[:, : vocab // 32]
        bitmask.copy_(host)
        mask_row.copy_(torch.randperm(rows, generator=gen).to(torch.int32) - rows // 4)  # a quarter unmasked
        graph.replay()
        expected = source.cpu()
        apply_grammar_mask_reference(expected, host, mask_row.cpu())
        assert torch.equal(logits.cpu(), expected)
