"""OpenAI request bodies -> engine requests: prompt ids and SamplingParams per choice, checked here against the
model's limits so a bad request is a 400 before anything reaches the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qwen3_runtime.params import RequestLimits, SamplingParams, check_request
from qwen3_runtime.server.errors import APIError
from qwen3_runtime.server.protocol import ChatCompletionRequest, CompletionRequest, _Request
from qwen3_runtime.server.structured_protocol import output_constraint
from qwen3_runtime.server.tokenize_protocol import TokenizeRequest
from qwen3_runtime.server.tool_constraint import tool_constraint
from qwen3_runtime.tokenizer import Tokenizer

# The most engine requests (prompts x n) one HTTP request may create: OpenAI's cap on n, so any one-prompt request
# OpenAI takes passes. Past it, one small body could queue minutes of work ahead of every other client.
DEFAULT_MAX_CHOICES = 128


@dataclass(frozen=True)
class InputContext:
    """What turning any body into engine requests reads besides the body: one argument, not four per endpoint."""

    tok: Tokenizer
    limits: RequestLimits
    defaults: dict[str, Any]  # the checkpoint's sampling defaults, for fields a request leaves unset
    max_choices: int = DEFAULT_MAX_CHOICES


@dataclass
class EngineInput:
    prompt_index: int  # which prompt of the HTTP request (usage counts each prompt once, however many choices)
    prompt: list[int]
    params: SamplingParams


def completion_prompts(req: CompletionRequest, tok: Tokenizer) -> list[list[int]]:
    """`prompt` as token-id lists: a text, texts, token ids, or lists of token ids."""
    p = req.prompt
    if isinstance(p, str):
        prompts = [tok.encode(p)]
    elif p and all(isinstance(x, str) for x in p):
        prompts = [tok.encode(x) for x in p]
    elif p and all(isinstance(x, int) for x in p):
        prompts = [list(p)]
    else:
        prompts = [list(x) for x in p]
    if not prompts or not all(prompts):
        raise APIError("prompt is empty: a request needs at least one prompt token", "prompt")
    return prompts


def completion_inputs(req: CompletionRequest, ctx: InputContext) -> list[EngineInput]:
    prompt_logprobs = req.prompt_logprobs
    if req.echo and req.logprobs is not None:  # the prompt's logprobs come first in the response
        prompt_logprobs = -1 if -1 in (prompt_logprobs, req.logprobs) else max(prompt_logprobs or 0, req.logprobs)
    fields = dict(max_tokens=req.max_tokens, logprobs=req.logprobs, prompt_logprobs=prompt_logprobs)
    fields["constraint"] = output_constraint(req)
    return _expand(req, completion_prompts(req, ctx.tok), fields, ctx)


def chat_inputs(req: ChatCompletionRequest, ctx: InputContext) -> list[EngineInput]:
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError("when using `top_logprobs`, `logprobs` must be set to true", "top_logprobs")
    max_tokens = req.max_completion_tokens or req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    rename = {"logprobs": "top_logprobs", "prompt": "messages"}  # chat's names for what the runtime checks
    if req.max_completion_tokens:
        rename["max_tokens"] = "max_completion_tokens"
    tools = tool_constraint(req.tools, req.tool_choice, req.parallel_tool_calls)  # required, or a named function
    constraint = output_constraint(req, tools and tools.output_constraint())
    fields = dict(max_tokens=max_tokens, logprobs=logprobs, constraint=constraint)
    return _expand(req, [chat_prompt(req, ctx.tok)], fields, ctx, rename)


def chat_prompt(req: ChatCompletionRequest | TokenizeRequest, tok: Tokenizer) -> list[int]:
    """The messages through the chat template, as token ids. vLLM lets chat_template_kwargs set
    apply_chat_template's own arguments: add_generation_prompt is honoured; the others would be variables no
    template reads (a silently different prompt), so they are a 400."""
    kwargs = dict(req.chat_template_kwargs or {})
    add_generation_prompt = kwargs.pop("add_generation_prompt", req.add_generation_prompt)
    if not isinstance(add_generation_prompt, bool):
        raise APIError("chat_template_kwargs.add_generation_prompt must be true or false", "chat_template_kwargs")
    for name in ("messages", "continue_final_message", "chat_template", "tokenize"):
        if kwargs.pop(name, False) is not False:
            raise APIError(f"chat_template_kwargs.{name} is not supported by this server", "chat_template_kwargs")
    messages = [m.as_template_input() for m in req.messages]
    if req.tools:  # as OpenAI's dicts, which Qwen3's template writes out whole
        kwargs["tools"] = [tool.model_dump(exclude_none=True) for tool in req.tools]
    try:
        return tok.encode(tok.apply_chat_template(messages, add_generation_prompt, **kwargs))
    except Exception as e:  # the template's own errors (raise_exception, a bad message shape)
        raise APIError(f"messages: the chat template failed: {e}", "messages") from None


def _expand(
    req: _Request, prompts: list[list[int]], fields: dict, ctx: InputContext, rename: dict | None = None
) -> list[EngineInput]:
    """n engine requests per prompt, with seeds seed, seed + 1, ... (or each its own random one). max_tokens: the
    fields' or, unset (None), the model's default, within what the context leaves (vLLM's get_max_tokens: the
    default is not a ceiling on a max_tokens asked for)."""
    limits, defaults, rename = ctx.limits, ctx.defaults, rename or {}
    _check_choices(len(prompts), req.n, ctx.max_choices)
    _check_logprobs(fields.get("logprobs"), "sample", limits, rename.get("logprobs", "logprobs"))
    _check_logprobs(fields.get("prompt_logprobs"), "prompt", limits, "prompt_logprobs")
    inputs = []
    for i, prompt in enumerate(prompts):
        room = _context_room(len(prompt), fields["max_tokens"], limits, rename)
        asked = fields["max_tokens"] if fields["max_tokens"] is not None else defaults.get("max_tokens")
        prompt_fields = {**fields, "max_tokens": room if asked is None else min(asked, room)}  # each prompt's own
        for j in range(req.n):
            seed = None if req.seed is None else (req.seed + j) % 2**63
            try:
                params = SamplingParams(
                    **req.sampling_fields(defaults),
                    seed=seed,
                    stop_token_ids=list(req.stop_token_ids or []),
                    ignore_eos=req.ignore_eos,
                    **prompt_fields,
                )
                prompt_ids, params = check_request(prompt, params, limits)
            except ValueError as e:
                raise APIError.from_value_error(e, rename) from None
            inputs.append(EngineInput(i, prompt_ids, params))
    return inputs


def _check_choices(num_prompts: int, n: int, max_choices: int) -> None:
    """A 400 when the request would create more than max_choices engine requests (prompts x n), naming the prompts
    when they alone are too many, else n and the range this many prompts leave it."""
    if num_prompts * n <= max_choices:
        return
    why = f"the server takes at most {max_choices} choices per request, prompts x n: --max-choices-per-request"
    if num_prompts > max_choices:
        raise APIError(f"prompt holds {num_prompts} prompts: at most {max_choices} are allowed ({why})", "prompt")
    prompts = f"{num_prompts} prompt" + ("s" if num_prompts > 1 else "")
    raise APIError(f"n={n} is out of range for {prompts}: must be in [1, {max_choices // num_prompts}] ({why})", "n")


def _context_room(prompt_len: int, max_tokens: int | None, limits: RequestLimits, rename: dict) -> int:
    """The tokens the context leaves after the prompt; a prompt that fills it, or a max_tokens past it, is a 400 in
    vLLM's words (clients read the limits from them)."""
    window, room = limits.max_model_len, limits.max_model_len - prompt_len
    if room <= 0:
        raise APIError(
            f"This model's maximum context length is {window} tokens. However, your request has {prompt_len} input "
            "tokens. Please reduce the length of the input messages.",
            rename.get("prompt", "prompt"),
        )
    if max_tokens is not None and max_tokens > room:
        raise APIError(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context length "
            f"is {window} tokens and your request has {prompt_len} input tokens ({max_tokens} > {window} - "
            f"{prompt_len}).",
            rename.get("max_tokens", "max_tokens"),
        )
    return room


def _check_logprobs(value: int | None, kind: str, limits: RequestLimits, param: str) -> None:
    """vLLM's wording for more logprobs than logprobs.max_logprobs allows."""
    if value is not None and limits.max_logprobs != -1 and value > limits.max_logprobs:
        raise APIError(
            f"Requested {kind} logprobs of {value}, which is greater than max allowed: {limits.max_logprobs}", param
        )
