"""Parity with transformers' Qwen3ForCausalLM on tiny random checkpoints (fp32, CPU); the helpers serve Qwen3-MoE's
parity tests too (test_qwen3_moe.py)."""

import pytest
import torch

from qwen3_runtime import ops
from qwen3_runtime.config import ModelConfig
from qwen3_runtime.kv_cache import allocate_kv_cache
from qwen3_runtime.layers.attention import AttentionMetadata
from qwen3_runtime.loader import load_model
from qwen3_runtime.ops.prefill_attention import PrefillPlan

# YaRN over an original context of 16 positions at theta 10,000: the prompt runs past it, and the ramp between kept
# and interpolated frequencies spans several of the head's 12 dimension pairs.
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 1e4}
SHAPES = [
    dict(tie_word_embeddings=True, num_key_value_heads=2),
    dict(tie_word_embeddings=False, num_key_value_heads=1),
    dict(tie_word_embeddings=False, num_key_value_heads=2, num_hidden_layers=3, head_dim=32),
    dict(tie_word_embeddings=True, num_key_value_heads=2, rope_parameters=YARN),
    dict(tie_word_embeddings=True, num_key_value_heads=2, rope_parameters={**YARN, "beta_fast": 8, "truncate": False}),
]
BLOCK = 8


def load_both(path):
    """Ours and transformers' model of the checkpoint (its config.json's class)."""
    import transformers

    ours = load_model(ModelConfig(path=str(path)), torch.device("cpu"), torch.float32)
    ours.build_rope_table(256)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return ours, theirs


def _rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def _prefill_meta(model, slots, query_lens, seq_lens, tables):
    """A prefill's metadata: each sequence's new tokens at `slots`, its blocks `tables[i]`."""
    cfg = model.config
    plan = PrefillPlan.build(
        query_lens, seq_lens, tables, slots.device, group_size=cfg.num_attention_heads // cfg.num_key_value_heads
    )
    return AttentionMetadata(slot_mapping=slots, prefill=plan)


@pytest.mark.parametrize("shape", SHAPES, ids=["tied-kv2", "untied-kv1", "untied-3layers-hd32", "yarn", "yarn-beta"])
def test_prefill_and_decode_logits_match_transformers(make_checkpoint, shape):
    ours, theirs = load_both(make_checkpoint(**shape))
    assert ours.lm_head_is_tied == shape["tie_word_embeddings"]
    assert_prefill_and_decode_match(ours, theirs)


def assert_prefill_and_decode_match(ours, theirs):
    """A 37-token prompt: all but its last token prefilled into non-contiguous blocks, the last decoded through the
    paged cache; both steps' logits within fp32 rounding of transformers' forward over the whole prompt."""
    ids = torch.randint(0, ours.config.vocab_size, (37,))
    with torch.no_grad():
        ref = theirs(ids[None]).logits[0]
    n = len(ids)
    kv = allocate_kv_cache(ours.config, 16, BLOCK, torch.float32, torch.device("cpu"))
    table = torch.randperm(16)[: (n + BLOCK - 1) // BLOCK]  # non-contiguous blocks
    slots = table[torch.arange(n) // BLOCK] * BLOCK + torch.arange(n) % BLOCK
    with torch.no_grad():
        meta = _prefill_meta(ours, slots[:-1], [n - 1], [n - 1], [table.tolist()])
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
    ours, _ = load_both(tiny_checkpoint)
    a, b = torch.randint(0, 512, (5,)), torch.randint(0, 512, (9,))
    kv = allocate_kv_cache(ours.config, 4, BLOCK, torch.float32, torch.device("cpu"))

    def run(ids, positions, slots, lens, tables):
        return ours.compute_logits(ours(ids, positions, kv, _prefill_meta(ours, slots, lens, lens, tables)))

    with torch.no_grad():
        packed_slots = torch.cat([torch.arange(5), torch.arange(8, 17)])  # a in block 0, b in blocks 1 and 2
        packed = run(
            torch.cat([a, b]), torch.cat([torch.arange(5), torch.arange(9)]), packed_slots, [5, 9], [[0], [1, 2]]
        )
        alone = run(b, torch.arange(9), torch.cat([torch.arange(24, 32), torch.arange(8, 9)]), [9], [[3, 1]])
    torch.testing.assert_close(packed[5:], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("triton_kernels", [True, False], ids=["triton", "pytorch"])
def test_chunked_prefill_equals_whole_prefill(tiny_checkpoint, monkeypatch, triton_kernels):
    """A prompt prefilled in two chunks, the second (starting mid-block) packed with another whole prompt,
    attends to its cached first chunk: its logits are the whole prompt's (prefilled into other blocks)."""
    if not triton_kernels:
        monkeypatch.setattr(ops, "TRITON_INTERPRET", False)
    ours, _ = load_both(tiny_checkpoint)
    ids, other = torch.randint(0, 512, (23,)), torch.randint(0, 512, (6,))
    kv = allocate_kv_cache(ours.config, 8, BLOCK, torch.float32, torch.device("cpu"))

    def run(ids, positions, query_lens, seq_lens, tables):
        slots = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for table, q, n in zip(tables, query_lens, seq_lens)
                              for p in range(n - q, n)])  # fmt: skip
        meta = _prefill_meta(ours, slots, query_lens, seq_lens, tables)
        return ours.compute_logits(ours(ids, positions, kv, meta))

    with torch.no_grad():
        whole = run(ids, torch.arange(23), [23], [23], [[5, 2, 7]])
        run(ids[:10], torch.arange(10), [10], [10], [[3, 6, 1]])
        chunk = run(
            torch.cat([other, ids[10:]]),
            torch.cat([torch.arange(6), torch.arange(10, 23)]),
            [6, 13],
            [6, 23],
            [[0], [3, 6, 1]],
        )
    torch.testing.assert_close(chunk[6:], whole[10:], rtol=1e-5, atol=1e-5)
