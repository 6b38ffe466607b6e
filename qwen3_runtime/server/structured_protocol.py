"""A request's structured-outputs fields -> one OutputConstraint (structured/spec.py), built in the API process
and sent to the engine in SamplingParams.

The fields: OpenAI's `response_format` (text, json_object, json_schema), vLLM's `structured_outputs` (json, regex,
choice, grammar; also json_object) and its older `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar`; on chat, a `tool_choice` that demands a call (server/tool_constraint.py). At most one per request:
two are a 400 naming both. Each constraint carries the field as the client wrote it, so an error the engine finds
later (a schema xgrammar cannot compile) names it too."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from qwen3_runtime.server.errors import APIError
from qwen3_runtime.structured import OutputConstraint, StructuredOutputError

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: str
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs: exactly one key."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


def output_constraint(req: Any, tool: OutputConstraint | None = None) -> OutputConstraint | None:
    """The one constraint the request's fields ask for (tool: tool_choice's), or None; a 400 naming the field."""
    found = [c for c in (_response_format(req.response_format), tool) if c is not None]
    if req.structured_outputs is not None:
        found += _structured_outputs(req.structured_outputs)
    found += [_build(GUIDED[name], value, name) for name in GUIDED if (value := getattr(req, name, None)) is not None]
    if len(found) > 1:
        names = " and ".join(c.field.split(".")[0] for c in found)
        raise APIError(f"{names}: a request takes at most one output constraint", found[1].field.split(".")[0])
    return found[0] if found else None


def _response_format(fmt: ResponseFormat | None) -> OutputConstraint | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return OutputConstraint.json_object("response_format")
    if fmt.type != "json_schema":
        raise APIError(f"response_format.type {fmt.type!r} is invalid: expected text, json_object or json_schema",
                       "response_format.type")  # fmt: skip
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise APIError("response_format.json_schema.schema is required for json_schema", "response_format")
    return _build("json", fmt.json_schema.schema_, "response_format.json_schema.schema")


def _structured_outputs(so: StructuredOutputs) -> list[OutputConstraint]:
    given = {k: v for k, v in so.model_dump(by_alias=True).items() if v not in (None, False)}
    if len(given) != 1:
        raise APIError(
            f"structured_outputs must hold one of json, regex, choice, grammar, json_object; got {sorted(given)}",
            "structured_outputs",
        )
    ((kind, value),) = given.items()
    return [_build(kind, value, f"structured_outputs.{kind}")]


def _build(kind: str, value: Any, field: str) -> OutputConstraint:
    try:
        if kind == "json":
            return OutputConstraint.json_schema(value, field)
        if kind == "json_object":
            return OutputConstraint.json_object(field)
        return getattr(OutputConstraint, kind)(value, field)
    except StructuredOutputError as e:
        raise APIError(str(e), e.field) from None
