"""Text <-> token ids for one model: encoding, decoding, each token's bytes, and the chat template."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import tokenizers

from qwen3_runtime.config import ConfigError, ModelConfig
from qwen3_runtime.tokenizer.builtin import _unicode_to_bytes, load_builtin_qwen3_hf_tokenizer
from qwen3_runtime.tokenizer.chat_template import QWEN3_CHAT_TEMPLATE, ChatTemplateError, compile_template, render
from qwen3_runtime.tokenizer.checkpoint import read_checkpoint_tokenizer
from qwen3_runtime.validation import check_text


class Tokenizer:
    """Text <-> token ids for one model, with its chat template and end-of-sequence ids."""

    def __init__(
        self,
        hf_tokenizer: tokenizers.Tokenizer,
        *,
        chat_template: str | None,
        special_tokens_map: dict[str, str],
    ) -> None:
        self._tok = hf_tokenizer
        self.chat_template = chat_template
        # bos_token, eos_token, ... as template variables (templates written for transformers may use them).
        self.special_tokens_map: dict[str, str] = dict(special_tokens_map)
        added = hf_tokenizer.get_added_tokens_decoder()
        self._added_content: dict[int, str] = {i: t.content for i, t in added.items()}
        self.special_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        if chat_template is not None:
            compile_template(chat_template)

    # --- construction -------------------------------------------------------------------------------------------

    @classmethod
    def builtin_qwen3(cls) -> Tokenizer:
        """Qwen3's tokenizer without a checkpoint (random-weight configs), with Qwen3's chat template."""
        return cls(
            load_builtin_qwen3_hf_tokenizer(),
            chat_template=QWEN3_CHAT_TEMPLATE,
            special_tokens_map={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        )

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> Tokenizer:
        """A checkpoint's tokenizer.json, chat template and EOS ids (checkpoint.py); ValueError names a bad file."""
        files = read_checkpoint_tokenizer(path)
        return cls(
            files.hf,
            chat_template=files.chat_template,
            special_tokens_map=files.special_tokens_map,
        )

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

    def load_token_tables(self) -> None:
        """Build the per-token bytes and text tables now rather than on first use (the server does, so the first
        request asking for logprobs does not wait for them)."""
        _ = self._token_texts  # built from the bytes table, which this builds too

    @functools.cached_property
    def _token_bytes(self) -> list[bytes]:
        to_byte = _unicode_to_bytes()
        table = [b""] * self.vocab_size
        for token, i in self._tok.get_vocab(with_added_tokens=False).items():
            try:
                table[i] = bytes(to_byte[c] for c in token)
            except KeyError:  # not a byte-level token: take its text
                table[i] = token.encode("utf-8")
        for i, content in self._added_content.items():
            table[i] = content.encode("utf-8")
        return table

    @functools.cached_property
    def _token_texts(self) -> list[str]:
        return [raw.decode("utf-8", errors="replace") for raw in self._token_bytes]

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token: a piece of a multi-byte character gives just its bytes (OpenAI logprobs).

        Ids past the vocabulary (the padding rows of the model's embedding, which a random-weight model can
        sample) have no bytes, as decode() skips them.
        """
        return _entry(self._token_bytes, token_id, b"")

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """Each token's own text; a token holding part of a character shows U+FFFD there (its bytes stay exact)."""
        texts = self._token_texts
        return [_entry(texts, i, "") for i in ids]

    # --- chat ---------------------------------------------------------------------------------------------------

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render a conversation to the prompt text; extra kwargs (e.g. enable_thinking=False) reach the template."""
        if self.chat_template is None:
            raise ChatTemplateError("this tokenizer has no chat template (tokenizer_config.json has no chat_template)")
        context = {**self.special_tokens_map, **kwargs}
        return render(self.chat_template, messages, add_generation_prompt, **context)


def _entry(table: list, token_id: int, past_the_vocabulary: bytes | str) -> bytes | str:
    if token_id < 0:
        raise ValueError(f"negative token id {token_id}")
    return table[token_id] if token_id < len(table) else past_the_vocabulary


def load_tokenizer(model: ModelConfig) -> Tokenizer:
    """model.tokenizer: builtin (Qwen3's, for random weights) or a directory with tokenizer.json; unset, the
    checkpoint's own (model.path), or the built-in one for random weights. A checkpoint without a tokenizer is an
    error naming both settings, not a fallback to Qwen3's: a fine-tune's own tokens would be read wrong without a
    word, and only the user knows whether its vocabulary is Qwen3's."""
    if model.tokenizer == "builtin" or (model.tokenizer is None and model.path is None):
        return Tokenizer.builtin_qwen3()
    key, source = ("model.tokenizer", model.tokenizer) if model.tokenizer else ("model.path", model.path)
    if model.tokenizer is None and not (Path(source) / "tokenizer.json").is_file():
        raise ConfigError(
            f"model.path={source!r} has no tokenizer.json: set model.tokenizer to a directory with the model's "
            "tokenizer.json and tokenizer_config.json (its base model's), or to builtin, Qwen3's own, if the "
            "checkpoint keeps Qwen3's vocabulary (vocab_size 151936 in config.json, as every Qwen3 size has)"
        )
    try:
        return Tokenizer.from_checkpoint(source)
    except ValueError as e:
        raise ConfigError(f"{key}={source!r}: {e}") from None


def prompt_ids(prompt: object, tokenizer: Callable[[], Tokenizer], chat_template_kwargs: dict[str, Any]) -> object:
    """Text and chat messages through the tokenizer (loaded by `tokenizer` only then; chat messages through the
    template given `chat_template_kwargs`); anything else is returned as it is, for the caller to check as ids."""
    if isinstance(prompt, str):
        return tokenizer().encode(check_text("prompt", prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        text = tokenizer().apply_chat_template(prompt, **chat_template_kwargs)
        return tokenizer().encode(check_text("prompt", text))
    return prompt
