"""POST /v1/completions: text (or token ids) in, text out, with OpenAI's legacy logprobs, echo, and vLLM's
prompt_logprobs."""

from __future__ import annotations

from fastapi.responses import JSONResponse, StreamingResponse

from qwen3_runtime.server.choice import Choice
from qwen3_runtime.server.generation import Generation
from qwen3_runtime.server.inputs import EngineInput, completion_inputs
from qwen3_runtime.server.logprob_format import completion_logprobs, merge_completion_logprobs, prompt_logprobs
from qwen3_runtime.server.protocol import CompletionRequest
from qwen3_runtime.server.sse import stream_response
from qwen3_runtime.server.state import ServerState, response_header
from qwen3_runtime.tokenizer import Tokenizer, detokenize


async def create_completion(req: CompletionRequest, state: ServerState) -> JSONResponse | StreamingResponse:
    inputs = completion_inputs(req, state.inputs)
    gen = Generation(state.client, state.tokenizer, inputs, req.text_options())
    gen.start()
    header = response_header("cmpl", "text_completion", state.model_name)
    if req.stream:
        return _stream(req, state.tokenizer, gen, header)
    choices = await gen.complete()
    body = [_ChoiceWriter(req, state.tokenizer, x).body(c) for c, x in zip(choices, inputs)]
    return JSONResponse({**header, "choices": body, "usage": gen.usage()})


def _stream(req: CompletionRequest, tok: Tokenizer, gen: Generation, header: dict) -> StreamingResponse:
    writers = [_ChoiceWriter(req, tok, x) for x in gen.inputs]

    def chunk_for(choice: Choice) -> dict | None:
        body = writers[choice.index].body(choice)
        return None if body is None else {**header, "choices": [body]}

    include_usage = req.stream_options is not None and req.stream_options.include_usage
    usage = (lambda: {**header, "choices": [], "usage": gen.usage()}) if include_usage else None
    return stream_response(gen, [], chunk_for, usage)


class _ChoiceWriter:
    """A choice's JSON, whole or as successive chunks: each call sends what is new since the last one."""

    def __init__(self, req: CompletionRequest, tok: Tokenizer, x: EngineInput) -> None:
        self.req, self.tok, self.x = req, tok, x
        self.started = self.ended = False
        self.prefix = ""  # the prompt's text, with echo
        self.prefix_offsets: list[int] = []
        if req.echo:
            self.prefix, self.prefix_offsets = detokenize(tok, x.prompt)

    def body(self, c: Choice) -> dict | None:
        if self.ended:
            return None
        text, ids, lps, offsets = c.delta()
        first, self.started = not self.started, True
        self.ended = c.finished
        if not (text or ids or first or c.finished):
            return None
        echo = self.req.echo and first
        out = {"index": c.index, "text": self.prefix + text if echo else text, "logprobs": None}
        if self.req.logprobs is not None:
            shift = len(self.prefix)
            out["logprobs"] = completion_logprobs(self.tok, ids, lps, [o + shift for o in offsets])
            if echo:
                prompt_lps = c.prompt_logprobs or [None] * len(self.x.prompt)
                echoed = completion_logprobs(self.tok, self.x.prompt, prompt_lps, self.prefix_offsets)
                out["logprobs"] = merge_completion_logprobs(echoed, out["logprobs"])
        out["finish_reason"] = c.finish_reason if c.finished else None
        if c.finished:
            out["stop_reason"] = c.stop_reason
        if first and self.req.prompt_logprobs is not None and c.prompt_logprobs is not None:
            out["prompt_logprobs"] = prompt_logprobs(self.tok, self.x.prompt, c.prompt_logprobs)
        return out
