"""A request's output constraint as plain, hashable data, checked when made: the API process builds it (no torch,
no xgrammar here), the engine compiles it once per distinct value (compiler.py caches by it).

The kinds are vLLM's `structured_outputs` keys: json (a JSON schema), json_object (any JSON object), regex, choice
(exactly one of a list of strings) and grammar (EBNF in the GBNF dialect xgrammar reads); tool_call and tool_calls are
what a chat's tool_choice `required` or a named function demands: one call (or one or more, "\n" between them), each
a JSON value of the schema `text` between the texts `wrap` (hermes' `<tool_call>\n` and `\n</tool_call>`). Every
error is a ValueError whose message starts with the request field the constraint came from (`field`), as the
server's 400 reports it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from qwen3_runtime.validation import show

ConstraintKind = Literal["json", "json_object", "regex", "choice", "grammar", "tool_call", "tool_calls"]
KINDS: tuple[str, ...] = get_args(ConstraintKind)


class StructuredOutputError(ValueError):
    """A constraint the engine cannot use; `field` is the request parameter it came from. Picklable (its args are
    the constructor's), so the engine process can send it back to the API process."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message, field)
        self.field = field

    def __str__(self) -> str:
        return self.args[0]


class InvalidConstraintError(StructuredOutputError):
    """The value has the wrong shape: a schema that is not a JSON object, an empty regex, a choice of nothing."""


class GrammarCompileError(StructuredOutputError):
    """xgrammar refused the constraint: a schema feature it lacks, a regex or grammar that does not parse."""


def invalid(cls: type[StructuredOutputError], field: str, value: object, reason: str) -> StructuredOutputError:
    """`cls` with the message shape of qwen3_runtime.validation: "field=value is invalid: reason"."""
    return cls(f"{field}={show(value)} is invalid: {reason}", field)


@dataclasses.dataclass(frozen=True)
class OutputConstraint:
    """What a request's output must match. Equal constraints share one compiled grammar: `field` is left out of
    equality and the hash.

    text: the JSON schema as compact JSON (json, tool_call(s); its key order kept, since properties are generated in
    it), the pattern (regex) or the grammar (grammar); empty otherwise. choices: a choice's strings, in order. wrap:
    the texts before and after each tool call."""

    kind: ConstraintKind
    text: str = ""
    choices: tuple[str, ...] = ()
    wrap: tuple[str, ...] = ()
    field: str = dataclasses.field(default="structured_outputs", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise invalid(InvalidConstraintError, self.field, self.kind, f"expected one of {', '.join(KINDS)}")
        if self.kind != "choice" and self.choices:
            raise invalid(InvalidConstraintError, self.field, self.choices, f"a {self.kind} constraint has no choices")
        if self.kind in ("json_object", "choice") and self.text:
            raise invalid(InvalidConstraintError, self.field, self.text, f"a {self.kind} constraint has no text")
        tool = self.kind in ("tool_call", "tool_calls")
        if tool != (len(self.wrap) == 2 and all(isinstance(w, str) for w in self.wrap)):
            raise invalid(InvalidConstraintError, self.field, self.wrap, "tool calls alone have a (begin, end) wrap")
        if self.kind == "json" or tool:
            _schema_object(self.text, self.field)
        elif self.kind in ("regex", "grammar") and not (isinstance(self.text, str) and self.text):
            raise invalid(InvalidConstraintError, self.field, self.text, "expected a non-empty string")
        elif self.kind == "choice":
            _check_choices(self.choices, self.field)

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str, field: str = "structured_outputs.json") -> OutputConstraint:
        """A JSON schema, as an object or its JSON text."""
        parsed = _schema_object(schema, field) if isinstance(schema, str) else schema
        if not isinstance(parsed, Mapping):
            raise invalid(InvalidConstraintError, field, schema, "expected a JSON schema (a JSON object)")
        try:
            text = json.dumps(parsed, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise invalid(InvalidConstraintError, field, schema, f"not JSON: {e}") from None
        return cls("json", text, field=field)

    @classmethod
    def tool_calls(
        cls, call_schema: Mapping[str, Any], wrap: tuple[str, str], exactly_one: bool, field: str = "tool_choice"
    ) -> OutputConstraint:
        """Tool calls whose JSON matches `call_schema`, each between wrap[0] and wrap[1]: one, or one or more."""
        text = cls.json_schema(call_schema, field).text
        return cls("tool_call" if exactly_one else "tool_calls", text, wrap=tuple(wrap), field=field)

    @classmethod
    def json_object(cls, field: str = "structured_outputs.json_object") -> OutputConstraint:
        """Any JSON object (response_format {"type": "json_object"})."""
        return cls("json_object", field=field)

    @classmethod
    def regex(cls, pattern: str, field: str = "structured_outputs.regex") -> OutputConstraint:
        """The whole output matches `pattern` (xgrammar's regex dialect: no lookaround, no backreferences)."""
        return cls("regex", pattern, field=field)

    @classmethod
    def choice(cls, choices: Sequence[str], field: str = "structured_outputs.choice") -> OutputConstraint:
        """The whole output is one of `choices`."""
        if isinstance(choices, str) or not isinstance(choices, Sequence):
            raise invalid(InvalidConstraintError, field, choices, "expected a list of strings")
        return cls("choice", choices=tuple(choices), field=field)

    @classmethod
    def grammar(cls, ebnf: str, field: str = "structured_outputs.grammar") -> OutputConstraint:
        """An EBNF grammar (GBNF, as llama.cpp and xgrammar read it) whose rule `root` the output matches."""
        return cls("grammar", ebnf, field=field)


def _schema_object(text: object, field: str) -> Any:
    """The JSON object `text` holds, or InvalidConstraintError naming `field`."""
    if not isinstance(text, str):
        raise invalid(InvalidConstraintError, field, text, "expected a JSON schema")
    try:
        schema = json.loads(text, parse_constant=_not_json)
    except ValueError as e:
        raise invalid(InvalidConstraintError, field, text, f"not JSON: {e}") from None
    if not isinstance(schema, dict):
        raise invalid(InvalidConstraintError, field, text, "expected a JSON schema (a JSON object)")
    return schema


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON value")


def _check_choices(choices: object, field: str) -> None:
    if not isinstance(choices, tuple) or not choices:
        raise invalid(InvalidConstraintError, field, choices, "expected a non-empty list of strings")
    for i, choice in enumerate(choices):
        if not isinstance(choice, str) or not choice:
            raise invalid(
                InvalidConstraintError, field, choices, f"choice {i} ({show(choice)}) is not a non-empty string"
            )
