"""Per-request sampling parameters, checked when they are made."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """What a request wants generated; names and defaults follow vLLM.

    A bad value raises ValueError naming the field, the value and the allowed range.
    """

    max_tokens: int = 16
    # 0 is greedy (ties go to the lower token id).
    temperature: float = 1.0
    # -1 (or 0): no top-k filter.
    top_k: int = -1
    top_p: float = 1.0
    # Makes a sampled request's tokens reproducible whatever else is in the batch.
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # Top logprobs per generated token (0: only the sampled token's); None: none.
    logprobs: int | None = None
    # Top logprobs per prompt token (the first prompt token has none); None: none.
    prompt_logprobs: int | None = None
    # raw: logprobs of the model's distribution; processed: of the one sampled from (after
    # temperature, top-k, top-p). None: the config's logprobs.mode.
    logprobs_mode: str | None = None

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, lo=1)
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature!r} is out of range: must be >= 0 (0 is greedy)")
        _check_int("top_k", self.top_k, lo=-1)
        _check_number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r} is out of range: must be in (0, 1]")
        if self.seed is not None:
            _check_int("seed", self.seed, lo=0, hi=2**63 - 1)
        if not isinstance(self.stop_token_ids, (list, tuple)):
            raise ValueError(f"stop_token_ids={self.stop_token_ids!r} is invalid: expected a list of token ids")
        for i, tok in enumerate(self.stop_token_ids):
            _check_int(f"stop_token_ids[{i}]", tok, lo=0)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos={self.ignore_eos!r} is invalid: expected true or false")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value, lo=-1)
        if self.logprobs_mode not in (None, "raw", "processed"):
            raise ValueError(f"logprobs_mode={self.logprobs_mode!r} is invalid: allowed values are raw, processed")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _check_int(name: str, value: object, lo: int | None = None, hi: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is invalid: expected an integer")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name}={value!r} is out of range: must be {bounds}")


def _check_number(name: str, value: object) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        raise ValueError(f"{name}={value!r} is invalid: expected a number")
