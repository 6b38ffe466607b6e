"""Output constraints (spec.py) compiled into xgrammar grammars over the model's vocabulary, off the step loop.

xgrammar, a maintained grammar engine, compiles a grammar against a TokenizerInfo: the bytes of every token id.
Ours comes from the runtime's own tokenizer: each token as its raw bytes (Qwen3's byte-level BPE tokens decoded,
added tokens such as <think> or <tool_call> as their text, as detokenization shows them); special tokens (those
skip_special_tokens drops: <|im_start|>, <|im_end|>, ...) and ids past the tokenizer (the model's embedding is
padded to 151,936) as no bytes, so no grammar admits them as text. The stop ids (the model's EOS) are allowed
where the grammar may end, and only there.

Compiling runs in one worker thread (xgrammar releases the GIL meanwhile, with `threads` of its own), so a new
schema never stalls a step; each distinct constraint compiles once (an LRU of futures keyed by the constraint), so
a second request with the same schema gets the first one's grammar at no cost.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import xgrammar as xgr
from xgrammar import structural_tag as st

from qwen3_runtime.structured.spec import GrammarCompileError, OutputConstraint, invalid

if TYPE_CHECKING:  # an annotation alone: params.py imports spec.py, and the tokenizer's config imports params.py
    from qwen3_runtime.tokenizer import Tokenizer

# Any JSON object: xgrammar's own JSON grammar allows unbounded whitespace, the schema compiler without
# any_whitespace does not.
_ANY_OBJECT = '{"type":"object"}'
# xgrammar's messages open with "[hh:mm:ss] /path/file.cc:line: ".
_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")
_LOOKAHEAD = re.compile(r"(?<!\\)\(\?[=!]")


def tokenizer_info(tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Iterable[int]) -> xgr.TokenizerInfo:
    """xgrammar's view of the model's vocabulary (`vocab_size`, the logits' width): see the module docstring."""
    known = min(tokenizer.vocab_size, vocab_size)
    special = tokenizer.special_ids
    vocab = [b"" if i in special else tokenizer.token_bytes(i) for i in range(known)]
    given = list(stop_token_ids)
    stops = sorted({i for i in given if 0 <= i < vocab_size})
    if not stops:  # xgrammar would guess them
        raise ValueError(f"stop_token_ids={given!r} is invalid: expected an id below {vocab_size}")
    return xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stops)


class ConstraintCompiler:
    """Compiles constraints for one tokenizer and vocabulary; `submit` at a request's arrival, the matcher built
    once its future is done (a request waits for its grammar, never the step)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        stop_token_ids: Iterable[int],
        *,
        threads: int = 2,
        cache_size: int = 256,
    ) -> None:
        self.info = tokenizer_info(tokenizer, vocab_size, stop_token_ids)
        self.vocab_size = vocab_size
        # The cache is ours (keyed by the constraint, holding failures too); xgrammar's would hold them twice.
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=threads, cache_enabled=False)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
        self._cache: OrderedDict[OutputConstraint, Future[xgr.CompiledGrammar]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def submit(self, constraint: OutputConstraint) -> Future[xgr.CompiledGrammar]:
        """The compiled grammar, or GrammarCompileError naming `constraint.field` (the caller's, even when another
        request's identical constraint compiled it) with xgrammar's message."""
        shared = self._shared(constraint)
        mine: Future[xgr.CompiledGrammar] = Future()

        def finish(done: Future[xgr.CompiledGrammar]) -> None:
            if done.cancelled():  # closed before it started
                mine.cancel()
                return
            error = done.exception()
            if error is None:
                mine.set_result(done.result())
            elif isinstance(error, _Refused):
                value = constraint.text or list(constraint.choices)
                mine.set_exception(invalid(GrammarCompileError, constraint.field, value, f"xgrammar: {error}"))
            else:
                mine.set_exception(error)

        shared.add_done_callback(finish)  # runs at once when `shared` is done
        return mine

    def compile(self, constraint: OutputConstraint) -> xgr.CompiledGrammar:
        """`submit`, waited for."""
        return self.submit(constraint).result()

    def close(self) -> None:
        """Stop the worker; compilations not yet started are cancelled."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _shared(self, constraint: OutputConstraint) -> Future[xgr.CompiledGrammar]:
        with self._lock:
            future = self._cache.get(constraint)
            if future is None:
                future = self._cache[constraint] = self._pool.submit(self._compile, constraint)
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(constraint)
            return future

    def _compile(self, constraint: OutputConstraint) -> xgr.CompiledGrammar:
        compiler, kind = self._compiler, constraint.kind
        try:
            if kind in ("json", "json_object"):
                # any_whitespace=False: separators ", " and ": " and no other whitespace between tokens, or models
                # loop on whitespace until max_tokens (vLLM #17393). strict_mode: no properties the schema does not
                # name (additionalProperties false unless it says otherwise), as OpenAI's strict schemas.
                schema = constraint.text if kind == "json" else _ANY_OBJECT
                if kind == "json" and (pattern := _lookahead_pattern(json.loads(schema))):
                    raise RuntimeError(f"lookahead is not supported (in the pattern {pattern!r})")
                return compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=True)
            if kind == "regex":
                return compiler.compile_regex(constraint.text)
            if kind in ("tool_call", "tool_calls"):
                return compiler.compile_structural_tag(tool_call_grammar(constraint))
            text = choice_grammar(constraint.choices) if kind == "choice" else constraint.text
            return compiler.compile_grammar(text)
        except (RuntimeError, ValueError) as e:
            raise _Refused(_LOG_PREFIX.sub("", str(e)).strip()) from None


def _lookahead_pattern(node: object) -> str | None:
    """A schema "pattern" with a lookahead, which xgrammar drops (a warning on stderr) where its regexes refuse it:
    the output would not be held to the pattern."""
    if isinstance(node, dict):
        pattern = node.get("pattern")
        if isinstance(pattern, str) and _LOOKAHEAD.search(pattern):
            return pattern
        node = list(node.values())
    if isinstance(node, list):
        return next((found for child in node if (found := _lookahead_pattern(child))), None)
    return None


class _Refused(Exception):
    """xgrammar's message for a constraint it cannot compile (the field is the asking request's: `submit`)."""


def tool_call_grammar(constraint: OutputConstraint) -> xgr.StructuralTag:
    """One call (tool_call), or one or more separated by "\n" (tool_calls). Each wrap text is a tag token (the
    hermes parser reads tags by id: the tag spelled in pieces would not be a call) with whitespace on its inner
    side; the call's JSON between them is compact, as every schema's here."""
    (begin, after), (end, before) = _tag(constraint.wrap[0]), _tag(constraint.wrap[1])
    text = [xgr.Grammar.from_ebnf("root ::= " + _literal(t)) for t in (after, before)]
    schema = xgr.Grammar.from_json_schema(constraint.text, any_whitespace=False, strict_mode=True)
    body = str(xgr.Grammar.concat(text[0], schema, text[1]))
    tag = st.TagFormat(
        begin=st.TokenFormat(token=begin), content=st.GrammarFormat(grammar=body), end=st.TokenFormat(token=end)
    )
    calls = st.TagsWithSeparatorFormat(
        tags=[tag], separator="\n", at_least_one=True, stop_after_first=constraint.kind == "tool_call"
    )
    return xgr.StructuralTag(format=calls)


def _tag(wrap: str) -> tuple[str, str]:
    """(the tag token's text, the whitespace beside it)."""
    tag = wrap.strip()
    return tag, wrap.replace(tag, "", 1)


def choice_grammar(choices: Iterable[str]) -> str:
    """An EBNF grammar matching exactly one of `choices`."""
    return "root ::= " + " | ".join(_literal(c) for c in choices)


def _literal(text: str) -> str:
    """`text` as an EBNF string literal: quotes and backslashes escaped, control characters as \\uHHHH (xgrammar
    reads \\x greedily: "\\x09a" would be one character, U+009A)."""
    escaped = ("\\" + c if c in '"\\' else f"\\u{ord(c):04x}" if ord(c) < 0x20 or c == "\x7f" else c for c in text)
    return '"' + "".join(escaped) + '"'
