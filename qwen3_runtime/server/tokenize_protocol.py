"""vLLM's /tokenize and /detokenize bodies (pydantic): not OpenAI's API, so apart from its bodies in protocol.py,
whose chat messages and refusal of unsupported fields they share."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from qwen3_runtime.server.errors import refused
from qwen3_runtime.server.protocol import UNSUPPORTED_CHAT, ChatMessage, check_messages, refuse_unless_off
from qwen3_runtime.server.tool_protocol import ChatTool

TOKENIZE_UNSUPPORTED = {
    "return_token_strs": (None, False),
    **{name: UNSUPPORTED_CHAT[name] for name in ("continue_final_message", "chat_template")},
}


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a text, or chat messages through the chat template (exactly one of them)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None  # rendered by the chat template, as a chat request's are
    # Qwen3's tokenizer adds no special tokens to a text (no BOS), so either value gives the same ids.
    add_special_tokens: bool = True

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise refused("prompt", "give either prompt or messages")
        check_messages(self.messages)
        return self

    @model_validator(mode="before")
    @classmethod
    def _unsupported_refused(cls, data: Any) -> Any:
        """vLLM's fields that change the ids but that this server does not implement: refused unless off, as the
        chat endpoint refuses them, so the count is never one of a prompt other than the chat's."""
        if isinstance(data, dict):
            refuse_unless_off(data, TOKENIZE_UNSUPPORTED)
        return data


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int]
