"""Structured outputs on the engine's side: each constrained request's grammar compiled off the step loop
(structured/compiler.py, made on first need: an engine that never sees a constraint never loads xgrammar), its
matcher made once the grammar is ready (until then the scheduler does not admit it: Request.awaiting_grammar), and
advanced by every token the request emits."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from qwen3_runtime.request import Request, Status
from qwen3_runtime.tokenizer import Tokenizer

if TYPE_CHECKING:
    from qwen3_runtime.structured.compiler import ConstraintCompiler


class RequestGrammars:
    def __init__(self, tokenizer: Callable[[], Tokenizer], vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        """`tokenizer`: the runtime's, loaded when the first constraint comes."""
        self._tokenizer, self._vocab_size, self._eos = tokenizer, vocab_size, tuple(eos_token_ids)
        self._compiler: ConstraintCompiler | None = None
        self._compiling: list[Request] = []

    def submit(self, req: Request) -> None:
        """Start compiling req's constraint, if it has one."""
        if req.params.constraint is None:
            return
        if self._compiler is None:
            from qwen3_runtime.structured.compiler import ConstraintCompiler

            self._compiler = ConstraintCompiler(self._tokenizer(), self._vocab_size, self._eos)
        req.grammar = self._compiler.submit(req.params.constraint)
        self._compiling.append(req)

    def refused(self) -> list[Request]:
        """Give each request whose grammar is compiled its matcher; those whose compile failed come back with
        `error` set (xgrammar's message, naming the request field)."""
        if not self._compiling:  # no constraint yet: xgrammar stays unloaded
            return []
        from qwen3_runtime.structured.matcher import ConstraintMatcher

        refused, still = [], []
        for req in self._compiling:
            if req.status is Status.FINISHED:  # aborted while compiling
                continue
            if not req.grammar.done():
                still.append(req)
            elif req.grammar.cancelled() or req.grammar.exception() is not None:
                req.error = str(req.grammar.exception() or "the grammar's compilation was cancelled")
                refused.append(req)
            else:
                req.matcher = ConstraintMatcher(req.grammar.result(), req.params.constraint_after)
        self._compiling = still
        return refused

    @staticmethod
    def rejection(req: Request, token_id: int) -> str | None:
        """Advance req's matcher by its emitted token; the error when the grammar refuses it (an engine fault: the
        mask allows only what it accepts)."""
        if req.matcher is None or req.matcher.accept(token_id):
            return None
        return f"token {token_id} was sampled outside the grammar of {req.params.constraint.field}"

    def close(self) -> None:
        if self._compiler is not None:
            self._compiler.close()
