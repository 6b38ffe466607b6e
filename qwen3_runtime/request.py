"""A request's state as it moves through the scheduler."""

from __future__ import annotations

from collections import abc
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from qwen3_runtime.packed_rows import StepLogprobs, plain_logprobs
from qwen3_runtime.params import SamplingParams

if TYPE_CHECKING:
    from concurrent.futures import Future

    from qwen3_runtime.logprobs import TokenLogprob
    from qwen3_runtime.structured.matcher import ConstraintMatcher


# The output slot of a token sampled by a launched step and not read yet. A step reserves a slot per
# request when it is launched (so positions and lengths count the token), the runtime fills it when it
# reads the step; a request that ends with an earlier token drops its slots past that token.
PENDING = -1


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    request_id: int
    prompt: list[int]
    params: SamplingParams
    seed: int  # the request's seed, or one drawn at submission
    output: list[int] = field(default_factory=list)
    logprobs: StepLogprobs = field(init=False)
    prompt_logprobs: abc.Sequence[TokenLogprob | None] | None = None
    prompt_logprob_parts: list = field(default_factory=list, repr=False)  # of a prompt scored in chunks so far
    block_table: list[int] = field(default_factory=list)
    # Prefix-cache keys of its full blocks, chained (block_hash.py); they depend only on tokens, so they
    # outlive a preemption and are never recomputed.
    block_hashes: list[bytes] = field(default_factory=list)
    num_computed_tokens: int = 0  # of a prompt being prefilled: tokens whose KV is computed (or scheduled)
    preempted: bool = False  # once: a readmission's prefix-cache hits are its own blocks, not counted as hits
    status: Status = Status.WAITING
    finish_reason: str | None = None  # stop | length | error | abort
    error: str | None = None
    stream: bool = False  # report each step's tokens (Runtime.take_updates)
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finished_time: float | None = None
    # Structured outputs: the grammar being compiled (until it is ready the request is not scheduled), then the
    # matcher every emitted token advances.
    grammar: Future | None = field(default=None, repr=False)
    matcher: ConstraintMatcher | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.logprobs = StepLogprobs(self.params.logprobs or 0)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.prompt[-1]

    def reserve_output_slot(self) -> int:
        self.output.append(PENDING)
        return len(self.output) - 1

    @property
    def awaiting_grammar(self) -> bool:
        """Constrained, its grammar not compiled yet: the scheduler does not admit it."""
        return self.params.constraint is not None and self.matcher is None

    @property
    def constrained(self) -> bool:
        """Whether its rows take a bitmask row (the masked tail) and are read before the next step launches."""
        return self.matcher is not None

    @property
    def needs_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None and self.prompt_logprobs is None

    def update(self, slot: int, finish_reason: str | None) -> RequestUpdate:
        """This step of a streamed request: the token in `slot` (none when it failed), with the prompt's
        logprobs on its first token."""
        new = [] if self.error else [self.output[slot]]
        logprobs = None if self.params.logprobs is None else list(self.logprobs[len(self.logprobs) - len(new) :])
        prompt_logprobs = self.prompt_logprobs if slot == 0 else None
        return RequestUpdate(
            self.request_id, new, logprobs, prompt_logprobs, finish_reason, self.error, len(self.prompt)
        )

    def to_output(self) -> RequestOutput:
        """Plain data (dataclasses.asdict and json.dumps work); the packed logprobs are built when first read."""
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.output,
            self.logprobs if self.params.logprobs is not None else None,
            self.prompt_logprobs,
            self.finish_reason,
            self.error,
            RequestMetrics(self.arrival_time, self.first_token_time, self.finished_time),
        )


class BuiltWhenRead:
    """A dataclass field of logprob entries that may be given packed (PackedLogprobs, StepLogprobs): kept packed
    until first read, then built into a plain list in one bulk unpack (and kept). So the step that finishes a
    request does no per-token Python work for its logprobs: whoever reads them does, in its own thread or
    process, and a pickled output carries the packed rows rather than thousands of objects. Reads (asdict, ==,
    repr, json) see the plain list."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.key = name, f"_{name}_entries"

    def __get__(self, obj: object, owner: type | None = None) -> list[TokenLogprob | None] | None:
        if obj is None:
            raise AttributeError(self.name)  # what dataclasses ask the class: the field has no default
        entries = obj.__dict__[self.key]
        if entries is not None and type(entries) is not list:
            entries = obj.__dict__[self.key] = plain_logprobs(entries)
        return entries

    def __set__(self, obj: object, entries: abc.Sequence[TokenLogprob | None] | None) -> None:
        obj.__dict__[self.key] = entries

    def stored(self, obj: object) -> abc.Sequence[TokenLogprob | None] | None:
        """The entries as given (packed or built), without building them."""
        return obj.__dict__[self.key]


@dataclass
class RequestUpdate:
    """What a streamed request produced in one step: its new tokens (and their logprobs, when asked), the
    prompt's logprobs with its first token, and how it finished when it did."""

    request_id: int | str  # the Runtime's id; the server's engine process renames it to the API process's
    token_ids: list[int]
    logprobs: list[TokenLogprob | None] | None
    prompt_logprobs: list[TokenLogprob | None] | None = BuiltWhenRead()
    finish_reason: str | None
    error: str | None
    num_prompt_tokens: int

    def __reduce__(self) -> tuple:
        # As TokenLogprob's: the engine process pickles one per request per step (the prompt's logprobs packed).
        prompt_logprobs = RequestUpdate.__dict__["prompt_logprobs"].stored(self)
        fields = (self.token_ids, self.logprobs, prompt_logprobs, self.finish_reason, self.error)
        return RequestUpdate, (self.request_id, *fields, self.num_prompt_tokens)


@dataclass
class RequestMetrics:
    """perf_counter() timestamps: TTFT = first_token_time - arrival_time."""

    arrival_time: float
    first_token_time: float | None
    finished_time: float | None


@dataclass
class RequestOutput:
    """What `Runtime.generate` returns per request; `error` is set when the request was rejected or failed.

    Plain data: `json.dumps(dataclasses.asdict(out))` works. A logprob may be -inf (a processed logprob
    of a token that top-k / top-p filtered out), which json.dumps writes as -Infinity: Python's json
    reads it back, strict JSON parsers do not (json.dumps(..., allow_nan=False) refuses it instead)."""

    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[TokenLogprob | None] | None = BuiltWhenRead()
    prompt_logprobs: list[TokenLogprob | None] | None = BuiltWhenRead()
    finish_reason: str | None
    error: str | None = None
    metrics: RequestMetrics | None = None

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first token (None when none was produced)."""
        if self.metrics is None or self.metrics.first_token_time is None:
            return None
        return self.metrics.first_token_time - self.metrics.arrival_time

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first (None with fewer than two tokens)."""
        if self.ttft is None or len(self.token_ids) < 2:
            return None
        return (self.metrics.finished_time - self.metrics.first_token_time) / (len(self.token_ids) - 1)
