"""What a forward's hardware floors are computed from: the bytes of weights it reads and the FLOPs of
its matmuls and attention."""

from __future__ import annotations

from qwen3_runtime.config import ArchitectureConfig
from qwen3_runtime.models.qwen3 import Qwen3ForCausalLM


def weight_bytes(model: Qwen3ForCausalLM) -> int:
    """Bytes a forward must read: every weight once (an untied embedding table is only gathered; of a MoE model's
    experts, those its tokens route to: routed_weight_bytes)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if not model.lm_head_is_tied:
        total -= model.model.embed_tokens.weight.numel() * model.model.embed_tokens.weight.element_size()
    return total


def layer_linear_params(arch: ArchitectureConfig) -> int:
    """Weights of the decoder layers' projections that each token multiplies (qkv, o, and gate_up and down: a dense
    layer's, or a sparse layer's router and its top-k experts'); not the lm_head, which a prefill applies only where
    it samples."""
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    hidden, layers = arch.hidden_size, arch.num_hidden_layers
    attention = hidden * (q + 2 * kv) + q * hidden
    sparse = getattr(arch, "num_sparse_layers", 0)
    routed = (arch.num_experts + 3 * arch.num_experts_per_tok * arch.moe_intermediate_size) * hidden if sparse else 0
    return layers * attention + (layers - sparse) * 3 * hidden * arch.intermediate_size + sparse * routed


def prefill_flops(arch: ArchitectureConfig, prompt_lens: list[int], logits_rows: int | None = None) -> int:
    """Matmul FLOPs of prefilling fresh prompts: 2 per weight per token in the layers, the lm_head over
    `logits_rows` positions (default: each prompt's last), and causal attention: QK^T and PV, 2 * head_dim
    FLOPs each per (query head, query, key attended), a query at position i attending to i + 1 keys."""
    rows = len(prompt_lens) if logits_rows is None else logits_rows
    linear = 2 * layer_linear_params(arch) * sum(prompt_lens) + 2 * arch.hidden_size * arch.vocab_size * rows
    keys = sum(n * (n + 1) // 2 for n in prompt_lens)
    attention = arch.num_hidden_layers * 2 * 2 * arch.num_attention_heads * arch.head_dim * keys
    return linear + attention


def decode_step_floor_s(
    arch: ArchitectureConfig, weight_nbytes: int, batch: int, context: int, kv_element_size: int, bandwidth: float,
    flops_per_s: float,
) -> float:  # fmt: skip
    """One decode step of `batch` rows over `context` tokens each: every weight and the rows' K/V read at
    `bandwidth` (timing.stream_bandwidths), or the matmul FLOPs (layers, lm_head, attention) at the large-matmul
    rate, whichever is longer."""
    kv = batch * context * arch.num_hidden_layers * 2 * arch.num_key_value_heads * arch.head_dim * kv_element_size
    flops = 2 * batch * (layer_linear_params(arch) + arch.hidden_size * arch.vocab_size)
    flops += batch * arch.num_hidden_layers * 2 * 2 * arch.num_attention_heads * arch.head_dim * context
    return max((weight_nbytes + kv) / bandwidth, flops / flops_per_s)


def expert_bytes(model: Qwen3ForCausalLM) -> tuple[int, int]:
    """(bytes of every expert of every sparse layer, bytes of one expert's projections); (0, 0) for a dense model."""
    stacks = [(m.w13_weight, m.w2_weight) for m in model.modules() if hasattr(m, "w13_weight")]
    if not stacks:
        return 0, 0
    total = sum(w13.nbytes + w2.nbytes for w13, w2 in stacks)
    return total, (stacks[0][0].nbytes + stacks[0][1].nbytes) // stacks[0][0].shape[0]


def routed_weight_bytes(all_bytes: int, experts: tuple[int, int], routed: float) -> int:
    """What a step must read of weights (`all_bytes`: weight_bytes) when its rows route to `routed` distinct experts
    in all (summed over the sparse layers): the experts not routed to are not read."""
    total, one = experts
    return int(all_bytes - total + routed * one)
