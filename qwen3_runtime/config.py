"""YAML configuration: frozen dataclasses, validated with errors that name the dotted key."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from qwen3_runtime.models.qwen3_config import Qwen3Config
from qwen3_runtime.models.qwen3_moe_config import Qwen3MoeConfig
from qwen3_runtime.params import SamplingParams
from qwen3_runtime.typed_config import MAX_SIZE, ConfigError, bounds, build, size_bounds

# Seeds fit int64, as torch's generators take them.
MAX_SEED = 2**63 - 1

# The type of model.architecture: a family's shape. A YAML mapping builds the one whose keys it uses (num_experts:
# Qwen3-MoE's), each family's shape a Qwen3Config (typed_config._closest).
ArchitectureConfig = Qwen3Config | Qwen3MoeConfig


@dataclass(frozen=True)
class ModelConfig:
    # A Hugging Face checkpoint directory (config.json + safetensors); None = random weights.
    path: str | None = None
    # The shape used for random weights when `path` is None.
    architecture: ArchitectureConfig | None = None
    # Seed of the random weights.
    seed: int = field(default=0, metadata=bounds(0, MAX_SEED))
    # auto: bfloat16 on a GPU, float32 on the CPU.
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    # Text in and out: builtin (Qwen3's tokenizer, shipped offline) or a directory with tokenizer.json;
    # None: the checkpoint's own (model.path), or builtin for random weights.
    tokenizer: str | None = None
    # auto: the sampling fields the checkpoint's generation_config.json sets (temperature, top_k, top_p, min_p,
    # repetition_penalty, max_new_tokens as max_tokens) are the defaults of requests that leave them unset, as in
    # vLLM; neutral: SamplingParams' own defaults (OpenAI's: temperature 1, no filter).
    generation_config: Literal["auto", "neutral"] = "auto"
    # fp8: the projections in block FP8 (e4m3, one scale per 128 x 128 block): random weights and a 16-bit
    # checkpoint's are quantized as they load, an FP8 checkpoint's loaded as stored. None: a checkpoint's own format
    # (config.json's quantization_config), 16-bit for random weights (quantization.py).
    quantization: Literal["fp8"] | None = None

    def __post_init__(self) -> None:
        if self.path is None and self.architecture is None:
            raise ConfigError(
                "path is null and no architecture is given: set model.path to a "
                "checkpoint directory or model.architecture to a shape"
            )


@dataclass(frozen=True)
class EngineConfig:
    # auto: cuda when available, else cpu.
    device: str = "auto"
    # Prompt and generated tokens of a request. None: the model's context (ArchitectureConfig.max_context), capped
    # by what the KV cache holds (device.size_kv_cache), as vLLM does.
    max_model_len: int | None = field(default=None, metadata=size_bounds(2))
    max_num_seqs: int = field(default=64, metadata=size_bounds(1))
    # Tokens of one step, as vLLM counts them: the decoding requests riding in a prefill step (a token each) and
    # prompt chunks in the rest, so a longer prompt is prefilled over several steps and this bounds the decoding
    # requests' stall. At least max_num_seqs (vLLM's rule too), so the prompts always keep a token of it.
    max_num_batched_tokens: int = field(default=8192, metadata=size_bounds(1))
    block_size: int = field(default=16, metadata=size_bounds(1))
    # None: enough for max_num_seqs full-length sequences, capped by gpu_memory_utilization of the free memory less
    # what the largest step needs (memory_profile.py).
    num_kv_blocks: int | None = field(default=None, metadata=size_bounds(1))
    gpu_memory_utilization: float = field(default=0.9, metadata=bounds(0, 1, lo_open=True))
    # Capture the decode step (one graph per padded batch size and variant) and the prefill forward (per token
    # bucket) in CUDA graphs; GPU only.
    cuda_graphs: bool = True
    # Padded batch sizes; None: 1, 2, 4, 8, then steps of 8 up to max_num_seqs.
    cuda_graph_buckets: list[int] | None = None
    # Prefill steps of up to this many tokens (prompt chunks and decoding rows) replay CUDA graphs too, padded to
    # steps of 16 tokens up to 256, of 64 up to 1024, then of 256; longer ones run eagerly, where the GPU's time
    # hides the host's.
    prefill_graph_max_tokens: int = field(default=2048, metadata=size_bounds(1))
    # Launch each step (decode or prefill) before reading the one before, so the host's work overlaps the GPU's; a
    # request that stops on a token costs one discarded row in the step after.
    async_scheduling: bool = True
    # Reuse the KV of full blocks whose tokens (and all tokens before them) an earlier request computed.
    prefix_caching: bool = True
    # A request's tokens and logprobs the same bits whatever else runs beside it, however its prompt is chunked,
    # cached or preempted (as vLLM's and SGLang's deterministic modes): every step runs as a prefill step (one
    # attention kernel for every token) and every product by a kernel of fixed tiles. Slower; CUDA only.
    batch_invariant: bool = False
    # Threads of torch's CPU work (process-wide, as torch's setting is). None: torch's own, OMP_NUM_THREADS where
    # set, else one per core; on a machine other work keeps busy, fewer (often 1) can be much faster, since each
    # small op waits for its slowest thread.
    cpu_threads: int | None = field(default=None, metadata=size_bounds(1))

    def __post_init__(self) -> None:
        if self.device != "auto" and not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ConfigError(f"device={self.device!r} is invalid: use auto, cpu, cuda or cuda:N")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is out of range: must be >= "
                f"max_num_seqs={self.max_num_seqs} (a step holds a token of every running request)"
            )
        for size in self.cuda_graph_buckets or []:
            if not 1 <= size <= self.max_num_seqs:
                raise ConfigError(
                    f"cuda_graph_buckets={self.cuda_graph_buckets} is invalid: every size must be "
                    f"in [1, max_num_seqs={self.max_num_seqs}]"
                )

    @property
    def max_step_tokens(self) -> int:
        """The most tokens a step can hold, which sizes the prefill's buffers: the budget, or every sequence at full
        length when that is fewer (of a Runtime's config, whose max_model_len is resolved)."""
        return min(self.max_num_batched_tokens, self.max_num_seqs * self.max_model_len)


@dataclass(frozen=True)
class LogprobsConfig:
    # device: reduce on the GPU, copy back O(k) numbers; host: copy full rows, scan in float64.
    path: Literal["device", "host"] = "device"
    # Largest `logprobs` / `prompt_logprobs` a request may ask for; -1 allows the full vocabulary.
    max_logprobs: int = field(default=20, metadata=bounds(-1, MAX_SIZE))
    # Default logprobs_mode of requests: raw (before temperature / top-k / top-p) or processed.
    mode: Literal["raw", "processed"] = "raw"
    # Prompt positions whose logits exist at once when computing prompt logprobs. Each chunk's lm_head product
    # reads the whole lm_head again, so chunks of fewer rows run under the matmul rate.
    prompt_chunk_size: int = field(default=512, metadata=size_bounds(1))


@dataclass(frozen=True)
class GenerateConfig:
    """The CLI's main job: explicit prompts, or random prompts of a fixed length."""

    prompts: list[list[int]] | None = None
    num_prompts: int = field(default=4, metadata=size_bounds(1))
    prompt_len: int = field(default=16, metadata=size_bounds(1))
    prompt_seed: int = field(default=0, metadata=bounds(0, MAX_SEED))
    # None: the model's defaults (Runtime.default_sampling_params), as vLLM's LLM.generate without params.
    sampling: SamplingParams | None = None


@dataclass(frozen=True)
class Config:
    model: ModelConfig
    engine: EngineConfig = EngineConfig()
    logprobs: LogprobsConfig = LogprobsConfig()
    generate: GenerateConfig = GenerateConfig()

    def with_max_model_len(self, max_model_len: int) -> Config:
        """This config with engine.max_model_len resolved (Runtime.config)."""
        return replace(self, engine=replace(self.engine, max_model_len=max_model_len))


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Load a YAML file (or a bundled config name such as 'tiny') and apply dotted overrides."""
    raw = _parse_yaml(_resolve(path)) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    for key, value in (overrides or {}).items():
        _set_dotted(raw, key, value)
    return build(Config, raw, "")


def parse_override(text: str) -> tuple[str, Any]:
    """'logprobs.path=host' -> ('logprobs.path', 'host'); the value is parsed as YAML."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. logprobs.path=host")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {text!r}: the value is not valid YAML: {_yaml_problem(e)}") from None


def _parse_yaml(file: Path) -> Any:
    try:
        return yaml.safe_load(file.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{file}: not readable ({e})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{file}: not valid YAML: {_yaml_problem(e)}") from None


def _yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line: what is wrong and where."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{getattr(e, 'problem', None) or e}{where}"


def bundled_configs() -> list[str]:
    return sorted(p.name[: -len(".yaml")] for p in _bundled_dir().glob("*.yaml"))


def _bundled_dir() -> Path:
    """The copy installed inside the package (pyproject maps configs/ to qwen3_runtime/configs), else
    configs/ of a source checkout. Not importlib.resources: without an __init__.py the installed
    configs/ is a namespace package, whose files() is a MultiplexedPath that str() does not turn into a path."""
    here = Path(__file__).resolve().parent
    installed = here / "configs"
    return installed if installed.is_dir() else here.parent / "configs"


def _resolve(path: str | Path) -> Path:
    p = Path(path)
    if p.exists():
        return p
    bundled = _bundled_dir() / (p.name if p.name.endswith(".yaml") else f"{p.name}.yaml")
    if p.parent == Path(".") and bundled.is_file():
        return bundled
    raise ConfigError(f"config {str(path)!r} not found (bundled: {', '.join(bundled_configs())})")


def _set_dotted(raw: dict, key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = raw
    for i, part in enumerate(parents):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {key}: {'.'.join(parents[: i + 1])} is not a section")
    node[leaf] = value
