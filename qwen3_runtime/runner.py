"""Runs the model for a scheduled batch: packs inputs, forwards, samples, returns host results."""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from qwen3_runtime.config import EngineConfig
from qwen3_runtime.kv_cache import cdiv
from qwen3_runtime.model import AttentionMetadata, Qwen3ForCausalLM
from qwen3_runtime.ops.decode_attention import default_num_splits
from qwen3_runtime.sampler import SamplingTensors, sample
from qwen3_runtime.sequence import Sequence


@dataclass
class DecodeInputs:
    """Static per-row decode inputs; the device copy is what a captured graph reads."""

    input_ids: torch.Tensor  # int64 [max_bs]
    positions: torch.Tensor  # int64 [max_bs]
    slot_mapping: torch.Tensor  # int64 [max_bs], -1 for padded rows
    block_tables: torch.Tensor  # int32 [max_bs, max_blocks]
    seq_lens: torch.Tensor  # int32 [max_bs], 0 for padded rows
    temperature: torch.Tensor  # f32 [max_bs]
    top_k: torch.Tensor  # int32 [max_bs]
    top_p: torch.Tensor  # f32 [max_bs]
    seed: torch.Tensor  # int64 [max_bs]

    @classmethod
    def allocate(cls, max_bs: int, max_blocks: int, device: torch.device, pin: bool = False) -> "DecodeInputs":
        def empty(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device, pin_memory=pin)

        i64, i32, f32 = torch.int64, torch.int32, torch.float32
        return cls(empty(max_bs, dtype=i64), empty(max_bs, dtype=i64), empty(max_bs, dtype=i64),
                   empty(max_bs, max_blocks, dtype=i32), empty(max_bs, dtype=i32), empty(max_bs, dtype=f32),
                   empty(max_bs, dtype=i32), empty(max_bs, dtype=f32), empty(max_bs, dtype=i64))

    def copy_from(self, host: "DecodeInputs", rows: int) -> None:
        for f in fields(self):
            getattr(self, f.name)[:rows].copy_(getattr(host, f.name)[:rows], non_blocking=True)

    def sampling(self, rows: int) -> SamplingTensors:
        # The token being sampled sits one past the input token.
        return SamplingTensors(self.temperature[:rows], self.top_k[:rows], self.top_p[:rows],
                               self.seed[:rows], self.positions[:rows] + 1)


class ModelRunner:
    def __init__(self, model: Qwen3ForCausalLM, kv_cache: torch.Tensor, cfg: EngineConfig) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = cfg.block_size
        self.device = kv_cache.device
        max_blocks = cdiv(cfg.max_model_len, cfg.block_size)
        self.max_model_len = cfg.max_model_len
        self.num_sms = (torch.cuda.get_device_properties(self.device).multi_processor_count
                        if self.device.type == "cuda" else 1)
        self.inputs = DecodeInputs.allocate(cfg.max_num_seqs, max_blocks, self.device)
        self.staging = DecodeInputs.allocate(cfg.max_num_seqs, max_blocks, torch.device("cpu"),
                                             pin=self.device.type == "cuda")

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> list[int]:
        """Process whole prompts (or a preempted sequence's tokens) and sample each one's next token."""
        lengths = [seq.num_tokens for seq in seqs]
        positions = np.concatenate([np.arange(n) for n in lengths])
        slots = np.concatenate([self._slots(seq, np.arange(seq.num_tokens)) for seq in seqs])
        cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        to_device = lambda a: torch.from_numpy(np.asarray(a, dtype=np.int64)).to(self.device)
        meta = AttentionMetadata(slot_mapping=to_device(slots), cu_seqlens=cu_seqlens)
        hidden = self.model(to_device(np.concatenate([seq.tokens for seq in seqs])),
                            to_device(positions), self.kv_cache, meta)
        logits = self.model.compute_logits(hidden[to_device(cu_seqlens[1:]) - 1])
        rows = _sampling_rows(seqs)
        params = SamplingTensors(
            temperature=torch.tensor(rows["temperature"], dtype=torch.float32, device=self.device),
            top_k=torch.tensor(rows["top_k"], dtype=torch.int32, device=self.device),
            top_p=torch.tensor(rows["top_p"], dtype=torch.float32, device=self.device),
            seed=to_device(rows["seed"]), position=to_device(lengths))
        return sample(logits, params, *_needs(seqs)).tolist()

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> list[int]:
        """One token for each running sequence, from static buffers."""
        rows = len(seqs)
        self._stage(seqs)
        self.inputs.copy_from(self.staging, rows)
        inp = self.inputs
        meta = AttentionMetadata(slot_mapping=inp.slot_mapping[:rows], block_tables=inp.block_tables[:rows],
                                 seq_lens=inp.seq_lens[:rows],
                                 num_splits=default_num_splits(rows, self.model.config.num_key_value_heads,
                                                               self.max_model_len, self.num_sms))
        hidden = self.model(inp.input_ids[:rows], inp.positions[:rows], self.kv_cache, meta)
        logits = self.model.compute_logits(hidden)
        return sample(logits, inp.sampling(rows), *_needs(seqs)).tolist()

    def _stage(self, seqs: list[Sequence]) -> None:
        host = self.staging
        for i, seq in enumerate(seqs):
            position = seq.num_tokens - 1
            host.input_ids[i] = seq.last_token
            host.positions[i] = position
            host.slot_mapping[i] = int(self._slots(seq, np.array([position]))[0])
            host.block_tables[i, :len(seq.block_table)] = torch.tensor(seq.block_table, dtype=torch.int32)
            host.seq_lens[i] = seq.num_tokens
        rows = _sampling_rows(seqs)
        n = len(seqs)
        for name in ("temperature", "top_k", "top_p", "seed"):
            getattr(host, name)[:n] = torch.tensor(rows[name])

    def _slots(self, seq: Sequence, positions: np.ndarray) -> np.ndarray:
        table = np.asarray(seq.block_table, dtype=np.int64)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size


def _sampling_rows(seqs: list[Sequence]) -> dict[str, list]:
    return {
        "temperature": [float(s.params.temperature) for s in seqs],
        "top_k": [s.params.top_k for s in seqs],
        "top_p": [float(s.params.top_p) for s in seqs],
        "seed": [s.seed for s in seqs],
    }


def _needs(seqs: list[Sequence]) -> tuple[bool, bool]:
    """Whether any row samples at random, and whether any random row filters by top-k / top-p."""
    random_rows = [s.params for s in seqs if not s.params.greedy]
    return bool(random_rows), any(p.top_k > 0 or p.top_p < 1 for p in random_rows)
