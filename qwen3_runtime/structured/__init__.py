"""Structured outputs: what a request's output must match (spec.py, plain data the API process builds), the
grammars compiled from it (compiler.py) and each request's matcher that fills its row of the step's token bitmask
(matcher.py); ops/grammar_mask.py applies that bitmask to the logits on the device.

Only spec.py's names are exported here: importing this package loads neither torch nor xgrammar."""

from qwen3_runtime.structured.spec import (
    ConstraintKind,
    GrammarCompileError,
    InvalidConstraintError,
    OutputConstraint,
    StructuredOutputError,
)

__all__ = [
    "ConstraintKind",
    "GrammarCompileError",
    "InvalidConstraintError",
    "OutputConstraint",
    "StructuredOutputError",
]
