"""OpenAI's error body, and the mapping of the runtime's ValueErrors (which name the field) onto it."""

from __future__ import annotations

import re

from fastapi.responses import JSONResponse
from pydantic_core import PydanticCustomError

_FIELD = re.compile(r"^([A-Za-z_]\w*)")


class APIError(Exception):
    """An error the client gets as OpenAI's {"error": {...}} with `status`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    @classmethod
    def from_value_error(cls, e: ValueError, rename: dict[str, str] | None = None) -> APIError:
        """A runtime check's ValueError ("top_p=1.5 is out of range: ...") as a 400 naming its field."""
        message = str(e)
        match = _FIELD.match(message)
        param = match.group(1) if match else None
        return cls(message, (rename or {}).get(param, param))

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def refused(param: str, message: str) -> PydanticCustomError:
    """A validation error whose 400 names `param` (validation_error reads it from the context)."""
    return PydanticCustomError("unsupported", message, {"param": param})


def body_not_utf8(e: UnicodeDecodeError) -> APIError:
    """A body FastAPI could not decode: its error says only that parsing failed."""
    return APIError(f"the request body must be UTF-8 JSON: {e}")


def engine_unavailable() -> APIError:
    return APIError("the engine process is not running", status=503, kind="ServiceUnavailableError")


def validation_error(errors: list[dict]) -> APIError:
    """Pydantic's first error, with its field path (body.messages.0.role -> messages[0].role); an error raised by
    protocol.refused names its field in its context and says it in its message. An error about the body as a
    whole (not JSON, not an object) names no field: its param is null."""
    first = errors[0]
    ctx = first.get("ctx", {})
    if "param" in ctx:  # protocol.refused: "" when it is about no one field
        return APIError(str(first.get("msg")), ctx["param"] or None)
    if first.get("type") == "json_invalid":  # loc is ("body", character): no field to name
        where = first["loc"][-1]
        return APIError(f"the request body is not valid JSON: {first['ctx']['error']} at character {where}")
    if tuple(first.get("loc", ())) == ("body",):  # missing, or not an object (a list, or not sent as JSON)
        return APIError(f"the request body must be a JSON object with Content-Type: application/json ({first['msg']})")
    # A union's failed branch adds its type to the path (prompt.list[int].0): keep the field names only.
    names = [p for p in first.get("loc", ()) if p != "body" and p not in ("str", "int", "list", "dict")]
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in names if "[" not in str(p)).lstrip(".")
    return APIError(f"{param}: {first.get('msg')}" if param else str(first.get("msg")), param or None)
