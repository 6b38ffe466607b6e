"""POST /v1/chat/completions: messages through the tokenizer's chat template, OpenAI's per-token logprobs, and the
answer split into thinking, content and tool calls by the server's parsers (chat_output.py)."""

from __future__ import annotations

from fastapi.responses import JSONResponse, StreamingResponse

from qwen3_runtime.params import SamplingParams
from qwen3_runtime.server.chat_output import ChatOutput, ChatParsers
from qwen3_runtime.server.choice import Choice
from qwen3_runtime.server.errors import APIError
from qwen3_runtime.server.generation import Generation
from qwen3_runtime.server.inputs import chat_inputs
from qwen3_runtime.server.logprob_format import chat_logprobs
from qwen3_runtime.server.protocol import ChatCompletionRequest
from qwen3_runtime.server.sse import stream_response
from qwen3_runtime.server.state import ServerState, response_header
from qwen3_runtime.tokenizer import Tokenizer


async def create_chat_completion(req: ChatCompletionRequest, state: ServerState) -> JSONResponse | StreamingResponse:
    tok = state.tokenizer
    check_parsers(req, state.parsers)
    inputs = chat_inputs(req, state.inputs)
    gen = Generation(state.client, tok, inputs, req.text_options())
    outputs = [ChatOutput.for_request(state.parsers, req, x.prompt) for x in inputs]
    for x, out in zip(inputs, outputs):
        x.params.constraint_after = constraint_after(x.params, out, state.parsers)
    gen.start()
    if req.stream:
        return _stream(req, tok, gen, outputs, response_header("chatcmpl", "chat.completion.chunk", state.model_name))
    choices = await gen.complete()
    body = []
    for c, out in zip(choices, outputs):
        text, ids, lps, offsets = c.delta()
        whole = out.delta(text, ids, offsets, finished=True)
        body.append(
            {
                "index": c.index,
                "message": {"role": "assistant", **out.message(whole)},
                "logprobs": chat_logprobs(tok, ids, lps) if req.logprobs else None,
                "finish_reason": out.finish_reason(c.finish_reason),
                "stop_reason": c.stop_reason,
            }
        )
    header = response_header("chatcmpl", "chat.completion", state.model_name)
    return JSONResponse({**header, "choices": body, "usage": gen.usage()})


def constraint_after(params: SamplingParams, out: ChatOutput, parsers: ChatParsers) -> int | None:
    """With a reasoning parser, a constraint holds for the answer alone: from `</think>` on, unless the prompt closed
    the thinking already (enable_thinking false); else from the first token."""
    thinks = params.constraint is not None and out.reasoning is not None and not out.reasoning.ended
    return parsers.think.end if thinks else None


def check_parsers(req: ChatCompletionRequest, parsers: ChatParsers) -> None:
    """Tools the server would not parse the calls of are a 400, not an answer with the calls left in its text (with
    tool_choice "none" they are only shown to the model)."""
    if req.tools and req.tool_choice != "none" and parsers.tool_call is None:
        raise APIError("tools need the server to run with --tool-call-parser hermes", "tools")


def _stream(
    req: ChatCompletionRequest, tok: Tokenizer, gen: Generation, outputs: list[ChatOutput], header: dict
) -> StreamingResponse:
    """A first chunk per choice with the role, then deltas (thinking, content, tool calls) with their logprobs, then a
    chunk with the finish_reason; with stream_options.include_usage a last chunk with no choices and the usage."""
    ended: set[int] = set()

    def chunk_for(c: Choice) -> dict | None:
        if c.index in ended:
            return None
        text, ids, lps, offsets = c.delta()
        if not (text or ids or c.finished):
            return None
        out = outputs[c.index]
        delta = out.delta(text, ids, offsets, c.finished)
        if c.finished:
            ended.add(c.index)
        choice = {
            "index": c.index,
            "delta": delta.stream_fields(),
            "logprobs": chat_logprobs(tok, ids, lps) if req.logprobs else None,
            "finish_reason": out.finish_reason(c.finish_reason),
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
