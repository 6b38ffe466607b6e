"""vLLM's /tokenize and /detokenize: the ids the server would give the model for a text or a chat, and the text of
ids, so clients count tokens with the model's own tokenizer and chat template."""

from __future__ import annotations

from qwen3_runtime.server.errors import APIError
from qwen3_runtime.server.inputs import chat_prompt
from qwen3_runtime.server.state import ServerState
from qwen3_runtime.server.tokenize_protocol import DetokenizeRequest, TokenizeRequest
from qwen3_runtime.validation import check_token_ids


def tokenize(req: TokenizeRequest, state: ServerState) -> dict:
    tok = state.tokenizer
    ids = tok.encode(req.prompt) if req.prompt is not None else chat_prompt(req, tok)
    return {"count": len(ids), "max_model_len": state.limits.max_model_len, "tokens": ids, "token_strs": None}


def detokenize(req: DetokenizeRequest, state: ServerState) -> dict:
    try:
        check_token_ids("tokens", req.tokens, state.limits.vocab_size)
    except ValueError as e:
        raise APIError.from_value_error(e) from None
    return {"prompt": state.tokenizer.decode(req.tokens)}
