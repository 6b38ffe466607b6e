"""The engine's one-line summary, which `generate` and `serve` print: the model, where it runs, its limits (and
where max_model_len comes from), the KV cache's capacity and the captured graphs."""

from dataclasses import replace

from qwen3_runtime.summary import EngineSummary

GPU = EngineSummary(
    weights="checkpoint /ckpt/Qwen3-0.6B",
    num_parameters=596_049_920,
    num_layers=28,
    hidden_size=1024,
    num_heads=16,
    num_kv_heads=8,
    vocab_size=151936,
    weight_bytes=1_192_099_840,
    fp8=False,
    dtype="bfloat16",
    device="cuda:0",
    cpu_threads=16,
    max_model_len=30720,
    max_model_len_from="what the KV cache holds of the model's 40960",
    max_num_seqs=256,
    kv_cache_tokens=30720,
    decode_graph_buckets=(1, 2, 4, 8, 16, 24, 32),
    prefill_graph_buckets=(16, 32),
    capture_s=12.34,
)


def test_a_gpu_engine_names_its_checkpoint_limits_and_graphs():
    assert str(GPU) == (
        "model: checkpoint /ckpt/Qwen3-0.6B, 596.05M parameters (28 layers, hidden 1024, 16/8 heads, vocab 151936), "
        "weights 1.11 GiB in bfloat16; bfloat16 on cuda:0; max_model_len 30720 (what the KV cache holds of the model's "
        "40960), max_num_seqs 256; "
        "KV cache 30720 tokens; CUDA graphs: decode 1-32 rows (7 buckets), prefill 16, 32 tokens, captured in 12.3 s"
    )


def test_a_cpu_engine_says_its_threads_and_no_graphs():
    cpu = replace(GPU, device="cpu", cpu_threads=1, decode_graph_buckets=(), prefill_graph_buckets=())
    assert "; bfloat16 on cpu with 1 thread; " in str(cpu) and str(cpu).endswith("; CUDA graphs: none")


def test_a_moe_engine_counts_its_sparse_layers_and_experts():
    moe = replace(GPU, num_layers=48, experts=(48, 128, 8))
    assert "parameters (48 layers, 48 sparse of 128 experts, 8 per token, hidden 1024," in str(moe)


def test_fp8_weights_are_named_with_their_bytes():
    fp8 = replace(GPU, weight_bytes=750_000_000, fp8=True)
    assert "vocab 151936), weights 715.26 MiB in FP8 (128x128 blocks) and bfloat16; bfloat16 on cuda:0;" in str(fp8)
