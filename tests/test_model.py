"""Parity with transformers' Qwen3ForCausalLM on tiny random checkpoints (fp32, CPU)."""

import pytest
import torch

from qwen3_runtime.config import ModelConfig
from qwen3_runtime.kv_cache import allocate_kv_cache
from qwen3_runtime.loader import load_model
from qwen3_runtime.model import AttentionMetadata

SHAPES = [
    dict(tie_word_embeddings=True, num_key_value_heads=2),
    dict(tie_word_embeddings=False, num_key_value_heads=1),
    dict(tie_word_embeddings=False, num_key_value_heads=2, num_hidden_layers=3, head_dim=32),
]
BLOCK = 8


def _load_both(path):
    import transformers

    ours = load_model(ModelConfig(path=str(path)), torch.device("cpu"), torch.float32)
    ours.build_rope_table(256)
    theirs = transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return ours, theirs


def _rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("shape", SHAPES, ids=["tied-kv2", "untied-kv1", "untied-3layers-hd32"])
def test_prefill_and_decode_logits_match_transformers(make_checkpoint, shape):
    ours, theirs = _load_both(make_checkpoint(**shape))
    assert ours.lm_head_is_tied == shape["tie_word_embeddings"]
    ids = torch.randint(0, ours.config.vocab_size, (37,))
    with torch.no_grad():
        ref = theirs(ids[None]).logits[0]
    n = len(ids)
    kv = allocate_kv_cache(ours.config, 16, BLOCK, torch.float32, torch.device("cpu"))
    table = torch.randperm(16)[: (n + BLOCK - 1) // BLOCK]  # non-contiguous blocks
    slots = table[torch.arange(n) // BLOCK] * BLOCK + torch.arange(n) % BLOCK
    with torch.no_grad():
        # Prefill all but the last token, then decode the last one through the paged cache.
        meta = AttentionMetadata(slot_mapping=slots[:-1], cu_seqlens=[0, n - 1])
        prefill = ours.compute_logits(ours(ids[:-1], torch.arange(n - 1), kv, meta))
        meta = AttentionMetadata(
            slot_mapping=slots[-1:],
            block_tables=table[None].int(),
            seq_lens=torch.tensor([n], dtype=torch.int32),
            num_splits=3,
        )
        decode = ours.compute_logits(ours(ids[-1:], torch.tensor([n - 1]), kv, meta))
    assert _rel_err(prefill, ref[:-1]) <= 1e-4
    assert _rel_err(decode, ref[-1:]) <= 1e-4


def test_packed_prefill_equals_separate_prefills(tiny_checkpoint):
    ours, _ = _load_both(tiny_checkpoint)
    a, b = torch.randint(0, 512, (5,)), torch.randint(0, 512, (9,))
    kv = allocate_kv_cache(ours.config, 4, BLOCK, torch.float32, torch.device("cpu"))

    def run(ids, positions, slots, cu):
        meta = AttentionMetadata(slot_mapping=slots, cu_seqlens=cu)
        return ours.compute_logits(ours(ids, positions, kv, meta))

    with torch.no_grad():
        packed = run(torch.cat([a, b]), torch.cat([torch.arange(5), torch.arange(9)]), torch.arange(14), [0, 5, 14])
        alone = run(b, torch.arange(9), torch.arange(16, 25), [0, 9])
    torch.testing.assert_close(packed[5:], alone, rtol=1e-5, atol=1e-5)
