"""What the worst step the config allows needs on the GPU beyond the weights and the runner's static buffers,
measured before the KV cache is sized, so that the cache leaves room for it (vLLM's profile run).

Two steps run eagerly on a scratch KV cache of the longest prompt's blocks: a prefill of every token the
step budget allows over max_num_seqs requests (prompts of up to max_model_len - 1 tokens, the rest one-token
rows, as decoding rows ride), every prompt asking the largest prompt logprobs and every row the
largest processed logprobs, with top-p alone and penalties (the sort of the processed values, which those
rows' logprobs need, the penalties' pass and the prompt-logprobs chunk of logits); then a decode step of
max_num_seqs such rows. Their peaks bound what is held later: the decode graphs' pool (one decode step's
temporaries), the prefill graphs' pool and an eager prefill's temporaries (at most one full prefill each). What
a graph returns is held once per graph, so the decode step returns its static logits buffer."""

from __future__ import annotations

import torch

from qwen3_runtime.config import Config
from qwen3_runtime.kv_cache import allocate_kv_cache
from qwen3_runtime.ops import cdiv
from qwen3_runtime.params import SamplingParams
from qwen3_runtime.request import Request
from qwen3_runtime.runner import ModelRunner
from qwen3_runtime.scheduler import PrefillChunk


def worst_step_bytes(runner: ModelRunner, config: Config, dtype: torch.dtype) -> int:
    """Bytes to set aside for the runner's work before the KV cache is sized; the runner's cache, if any, is
    back in place after. On a CPU the steps run but nothing is measured (0): the Runtime profiles GPUs only."""
    engine, arch = config.engine, runner.model.config
    rows, budget, lengths = engine.max_num_seqs, engine.max_num_batched_tokens, []
    while len(lengths) < rows:
        lengths.append(min(budget - (rows - len(lengths) - 1), engine.max_model_len - 1))
        budget -= lengths[-1]
    # Every request writes the same blocks: the longest prompt's (or the decoding rows' two tokens). Not a
    # full-length sequence's, which need not fit in memory where max_model_len is the model's context.
    num_blocks = cdiv(max(*lengths, 2), engine.block_size)
    cache, runner.kv_cache = (
        runner.kv_cache,
        allocate_kv_cache(arch, num_blocks, engine.block_size, dtype, runner.device),
    )
    k = runner.tail.routing.k_max
    # The host path scores prompt rows on the CPU, far too slowly for a profile: its chunk of logits is counted.
    on_host = runner.tail.routing.on_host(k)
    params = SamplingParams(
        max_tokens=1, temperature=0.7, top_p=0.8, logprobs=k, logprobs_mode="processed",
        prompt_logprobs=None if on_host else k, repetition_penalty=1.1,
    )  # fmt: skip
    table = list(range(num_blocks))
    prefill = [_request(-1 - i, [0] * n, params, table) for i, n in enumerate(lengths)]
    decode = [_request(-1 - len(lengths) - i, [0, 0], params, table) for i in range(engine.max_num_seqs)]
    peaks = []
    for run in (
        lambda: runner.prefill([PrefillChunk(req, 0, req.num_tokens) for req in prefill]),
        lambda: runner.launch_decode(decode),
    ):
        base = _reset_peak(runner.device)
        runner.collect(run())
        peaks.append(_peak(runner.device) - base)
    for req in prefill + decode:
        runner.release(req)
    runner.kv_cache = cache
    runner.stats.reset()
    if runner.device.type == "cuda":
        torch.cuda.empty_cache()
    if runner.device.type != "cuda":
        return 0
    prefill_peak, decode_peak = peaks
    if on_host:
        prefill_peak += config.logprobs.prompt_chunk_size * arch.vocab_size * 4
    # The masked tail (structured outputs), which the profile's requests do not take, adds an unmasked copy of the
    # logits, [rows, V] fp32 (the raw rows are restored from it in place).
    masked = rows * arch.vocab_size * 4
    return decode_peak + 2 * prefill_peak + masked


def _request(request_id: int, prompt: list[int], params: SamplingParams, table: list[int]) -> Request:
    req = Request(request_id, prompt, params, seed=0)
    req.block_table = table
    return req


def _reset_peak(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _peak(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)
