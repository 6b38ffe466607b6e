"""POST /v1/chat/completions: messages through the tokenizer's chat template, OpenAI's per-token logprobs."""

from __future__ import annotations

from fastapi.responses import JSONResponse, StreamingResponse

from qwen3_runtime.server.choice import Choice
from qwen3_runtime.server.generation import Generation
from qwen3_runtime.server.inputs import chat_inputs
from qwen3_runtime.server.logprob_format import chat_logprobs
from qwen3_runtime.server.protocol import ChatCompletionRequest
from qwen3_runtime.server.sse import stream_response
from qwen3_runtime.server.state import ServerState, response_header
from qwen3_runtime.tokenizer import Tokenizer


async def create_chat_completion(req: ChatCompletionRequest, state: ServerState) -> JSONResponse | StreamingResponse:
    tok = state.tokenizer
    inputs = chat_inputs(req, state.inputs)
    gen = Generation(state.client, tok, inputs, req.text_options())
    gen.start()
    if req.stream:
        return _stream(req, tok, gen, response_header("chatcmpl", "chat.completion.chunk", state.model_name))
    choices = await gen.complete()
    body = []
    for c in choices:
        text, ids, lps, _ = c.delta()
        logprobs = chat_logprobs(tok, ids, lps) if req.logprobs else None
        message = {"role": "assistant", "content": text}
        body.append(
            {
                "index": c.index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
        )
    header = response_header("chatcmpl", "chat.completion", state.model_name)
    return JSONResponse({**header, "choices": body, "usage": gen.usage()})


def _stream(req: ChatCompletionRequest, tok: Tokenizer, gen: Generation, header: dict) -> StreamingResponse:
    """A first chunk per choice with the role, then content deltas with their logprobs, then a chunk with the
    finish_reason; with stream_options.include_usage a last chunk with no choices and the usage."""
    ended: set[int] = set()

    def chunk_for(c: Choice) -> dict | None:
        if c.index in ended:
            return None
        text, ids, lps, _ = c.delta()
        if not (text or ids or c.finished):
            return None
        if c.finished:
            ended.add(c.index)
        choice = {
            "index": c.index,
            "delta": {"content": text} if text else {},
            "logprobs": chat_logprobs(tok, ids, lps) if req.logprobs else None,
            "finish_reason": c.finish_reason,
        }
        if c.finished:
            choice["stop_reason"] = c.stop_reason
        return {**header, "choices": [choice]}

    roles = [
        {
            **header,
            "choices": [
                {
                    "index": c.index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        for c in gen.choices
    ]
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    usage = (lambda: {**header, "choices": [], "usage": gen.usage()}) if include_usage else None
    return stream_response(gen, roles, chunk_for, usage)
