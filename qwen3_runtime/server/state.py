"""What the route handlers share: the engine client, the tokenizer, the model's name and limits, the server's
limits."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from qwen3_runtime.params import RequestLimits
from qwen3_runtime.server.chat_output import ChatParsers
from qwen3_runtime.server.engine_client import EngineClient
from qwen3_runtime.server.inputs import DEFAULT_MAX_CHOICES, InputContext
from qwen3_runtime.server.metrics import ServerMetrics
from qwen3_runtime.tokenizer import Tokenizer


@dataclass
class ServerState:
    client: EngineClient
    tokenizer: Tokenizer
    model_name: str
    limits: RequestLimits
    sampling_defaults: dict[str, Any]  # the checkpoint's generation_config.json's, for fields a request leaves unset
    metrics: ServerMetrics
    max_choices: int = DEFAULT_MAX_CHOICES  # the most engine requests (prompts x n) one HTTP request may create
    parsers: ChatParsers = ChatParsers()  # --reasoning-parser and --tool-call-parser (off by default)

    @property
    def inputs(self) -> InputContext:
        return InputContext(self.tokenizer, self.limits, self.sampling_defaults, self.max_choices)


def response_header(prefix: str, obj: str, model: str) -> dict:
    """The fields every response and chunk starts with."""
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()), "model": model}
