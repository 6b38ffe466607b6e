"""What an engine serves and within which limits, as one line: `generate` prints it, and `serve` once the engine
process has built its Runtime (server/messages.Ready carries it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwen3_runtime.runtime import Runtime


@dataclass(frozen=True)
class EngineSummary:
    weights: str  # "checkpoint PATH" or "random weights (seed N)"
    num_parameters: int
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    weight_bytes: int  # every parameter once (a tied lm_head is the embeddings), FP8 scales included
    fp8: bool  # the projections are block FP8 (the rest in dtype)
    dtype: str
    device: str
    cpu_threads: int  # torch's threads for the CPU work
    max_model_len: int
    max_model_len_from: str  # where it comes from: the config, the model's context, or what the KV cache holds
    max_num_seqs: int
    kv_cache_tokens: int
    decode_graph_buckets: tuple[int, ...]  # padded batch sizes with captured CUDA graphs (none: eager)
    prefill_graph_buckets: tuple[int, ...]  # padded token counts with captured CUDA graphs
    capture_s: float
    # A MoE model's (sparse layers, experts in each, experts a token takes); None for a dense model.
    experts: tuple[int, int, int] | None = None

    @classmethod
    def of(cls, rt: Runtime, given_max_model_len: int | None) -> EngineSummary:
        """`given_max_model_len`: the config's engine.max_model_len before the Runtime resolved it."""
        import torch  # here, not at the top: the server's API process unpickles summaries without a Runtime

        arch, engine, path = rt.model.config, rt.config.engine, rt.config.model.path
        if given_max_model_len is not None:
            origin = "engine.max_model_len"
        elif engine.max_model_len < arch.max_context:
            origin = f"what the KV cache holds of the model's {arch.max_context}"
        else:
            origin = "the model's context"
        graphs = rt.runner.graphs.graphs, rt.runner.prefill_graphs.graphs
        params = list(rt.model.parameters())
        return cls(
            weights=f"checkpoint {path}" if path else f"random weights (seed {rt.config.model.seed})",
            num_parameters=sum(p.numel() for p in params),
            num_layers=arch.num_hidden_layers,
            hidden_size=arch.hidden_size,
            num_heads=arch.num_attention_heads,
            num_kv_heads=arch.num_key_value_heads,
            vocab_size=arch.vocab_size,
            weight_bytes=sum(p.nbytes for p in params),
            fp8=any(p.dtype == torch.float8_e4m3fn for p in params),
            dtype=str(rt.dtype).removeprefix("torch."),
            device=str(rt.device),
            cpu_threads=torch.get_num_threads(),
            max_model_len=engine.max_model_len,
            max_model_len_from=origin,
            max_num_seqs=engine.max_num_seqs,
            kv_cache_tokens=rt.scheduler.blocks.num_blocks * engine.block_size,
            decode_graph_buckets=tuple(sorted({size for size, _ in graphs[0]})),
            prefill_graph_buckets=tuple(sorted({size for size, _ in graphs[1]})),
            capture_s=rt.stats.capture_s,
            experts=(arch.num_sparse_layers, arch.num_experts, arch.num_experts_per_tok)
            if hasattr(arch, "num_experts")
            else None,
        )

    def __str__(self) -> str:
        threads = f" with {self.cpu_threads} thread{'s' * (self.cpu_threads > 1)}" if self.device == "cpu" else ""
        return (
            f"model: {self.weights}, {_count(self.num_parameters)} parameters ({self.num_layers} layers"
            f"{self._experts()}, hidden {self.hidden_size}, {self.num_heads}/{self.num_kv_heads} heads, vocab "
            f"{self.vocab_size}), weights {_bytes(self.weight_bytes)} in {self._format()}; "
            f"{self.dtype} on {self.device}{threads}; max_model_len {self.max_model_len} ({self.max_model_len_from}), "
            f"max_num_seqs {self.max_num_seqs}; KV cache {self.kv_cache_tokens} tokens; CUDA graphs: {self._graphs()}"
        )

    def _format(self) -> str:
        return f"FP8 (128x128 blocks) and {self.dtype}" if self.fp8 else self.dtype

    def _experts(self) -> str:
        if self.experts is None:
            return ""
        sparse, experts, top_k = self.experts
        return f", {sparse} sparse of {experts} experts, {top_k} per token"

    def _graphs(self) -> str:
        kinds = [
            f"{kind} {_sizes(sizes, unit)}"
            for kind, sizes, unit in (
                ("decode", self.decode_graph_buckets, "rows"),
                ("prefill", self.prefill_graph_buckets, "tokens"),
            )
            if sizes
        ]
        return f"{', '.join(kinds)}, captured in {self.capture_s:.1f} s" if kinds else "none"


def _sizes(buckets: tuple[int, ...], unit: str) -> str:
    """A few sizes one by one, more as their range and count."""
    if len(buckets) <= 4:
        return f"{', '.join(map(str, buckets))} {unit}"
    return f"{buckets[0]}-{buckets[-1]} {unit} ({len(buckets)} buckets)"


def _bytes(n: int) -> str:
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n / 2**10:.2f} KiB"


def _count(n: int) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)
