"""Request bodies -> engine requests, without a server: prompts, seeds per choice, max_tokens from the context, the
400s' parameters and vLLM's words."""

import json
from dataclasses import replace

import pytest

from qwen3_runtime.params import RequestLimits
from qwen3_runtime.server.errors import APIError
from qwen3_runtime.server.inputs import InputContext, chat_inputs, completion_inputs
from qwen3_runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from qwen3_runtime.tokenizer import Tokenizer

LIMITS = RequestLimits(vocab_size=151936, max_model_len=64, max_logprobs=5, eos_token_ids=(151645,))


@pytest.fixture(scope="module")
def ctx():
    return InputContext(Tokenizer.builtin_qwen3(), LIMITS, {})


def test_each_prompt_takes_n_choices_seeded_in_turn(ctx):
    req = CompletionRequest(prompt=[[1, 2], [3]], n=2, seed=2**63 - 1, max_tokens=4)
    inputs = completion_inputs(req, ctx)
    assert [(x.prompt_index, x.prompt, x.params.seed) for x in inputs] == [
        (0, [1, 2], 2**63 - 1),
        (0, [1, 2], 0),  # seed + 1, wrapped into the seeds' range
        (1, [3], 2**63 - 1),
        (1, [3], 0),
    ]
    unseeded = completion_inputs(CompletionRequest(prompt="hi", n=2), ctx)
    assert all(x.params.seed is None for x in unseeded)  # each drawn by the runtime


def test_max_tokens_defaults(ctx):
    (completion,) = completion_inputs(CompletionRequest(prompt=[1, 2, 3]), ctx)
    assert completion.params.max_tokens == 16  # OpenAI's default for completions
    unbounded = completion_inputs(CompletionRequest(prompt=[[1, 2, 3], [4] * 50], max_tokens=None), ctx)
    assert [x.params.max_tokens for x in unbounded] == [61, 14]  # what the context leaves each prompt
    (chat,) = chat_inputs(ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}]), ctx)
    assert chat.params.max_tokens == LIMITS.max_model_len - len(chat.prompt)
    both = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=9, max_completion_tokens=3)
    assert chat_inputs(both, ctx)[0].params.max_tokens == 3


def test_unset_sampling_fields_take_the_models_defaults(ctx):
    qwen3 = {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "max_tokens": 8}  # as a generation_config.json's
    defaults = replace(ctx, defaults=qwen3)
    fields = lambda x: (x.params.temperature, x.params.top_k, x.params.top_p, x.params.max_tokens)  # noqa: E731
    (unset,) = completion_inputs(CompletionRequest(prompt=[1], max_tokens=None), defaults)
    assert fields(unset) == (0.6, 20, 0.95, 8)
    given = CompletionRequest(prompt=[1], temperature=0, top_k=-1, max_tokens=4)
    assert fields(completion_inputs(given, defaults)[0]) == (0, -1, 0.95, 4)
    # the model's max_tokens is a default, not a ceiling (vLLM #34063); the context still bounds both
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=30)
    assert chat_inputs(chat, defaults)[0].params.max_tokens == 30
    (unset,) = chat_inputs(ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}]), defaults)
    assert unset.params.max_tokens == 8
    (near,) = completion_inputs(CompletionRequest(prompt=[1] * 60, max_tokens=None), defaults)
    assert near.params.max_tokens == 4  # what the context leaves, below the default
    (neutral,) = completion_inputs(CompletionRequest(prompt=[1]), ctx)
    assert fields(neutral) == (1.0, -1, 1.0, 16)


def test_echo_with_logprobs_asks_the_prompts_logprobs(ctx):
    (x,) = completion_inputs(CompletionRequest(prompt=[1, 2], echo=True, logprobs=2), ctx)
    assert (x.params.logprobs, x.params.prompt_logprobs) == (2, 2)


def test_logprobs_of_the_whole_vocabulary_where_the_engine_allows_them(ctx):
    """-1 passes with logprobs.max_logprobs: -1, echo's prompt logprobs too; else check_request says what it needs."""
    full = RequestLimits(vocab_size=151936, max_model_len=64, max_logprobs=-1)
    (x,) = completion_inputs(
        CompletionRequest(prompt=[1, 2], echo=True, logprobs=-1, prompt_logprobs=3), replace(ctx, limits=full)
    )
    assert (x.params.logprobs, x.params.prompt_logprobs) == (-1, -1)
    with pytest.raises(APIError) as info:
        completion_inputs(CompletionRequest(prompt=[1, 2], prompt_logprobs=-1), ctx)
    assert info.value.param == "prompt_logprobs" and info.value.message == (
        "prompt_logprobs=-1 is out of range: must be in [0, 5] (logprobs.max_logprobs; -1, the full vocabulary, needs "
        "logprobs.max_logprobs: -1)"
    )


@pytest.mark.parametrize(
    "make, param, message",
    [
        (lambda: CompletionRequest(prompt=[7] * 60, max_tokens=5), "max_tokens", "is too large: 5. This model's"),
        (lambda: CompletionRequest(prompt=[7] * 64), "prompt", "your request has 64 input tokens"),
        (lambda: CompletionRequest(prompt=[[7], [7] * 70]), "prompt", "your request has 70 input tokens"),
        (lambda: CompletionRequest(prompt=[1], logprobs=6), "logprobs", "greater than max allowed: 5"),
        (
            lambda: ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], max_completion_tokens=64),
            "max_completion_tokens",
            "(64 > 64 - ",
        ),
        (lambda: ChatCompletionRequest(messages=[{"role": "user", "content": "hi " * 80}]), "messages", "context"),
        # 32 stop ids and the EOS id: over the limit only when the EOS id counts, as the engine counts it
        (lambda: CompletionRequest(prompt=[1], stop_token_ids=list(range(32)), min_tokens=1), "min_tokens", "33 stop"),
    ],
)
def test_a_request_past_a_limit_is_a_400_naming_the_parameter(ctx, make, param, message):
    req = make()
    build = chat_inputs if isinstance(req, ChatCompletionRequest) else completion_inputs
    with pytest.raises(APIError) as info:
        build(req, ctx)
    error = info.value
    assert error.status == 400 and error.param == param and message in error.message, error.message


def test_chat_template_kwargs_naming_apply_chat_template_arguments(ctx):
    """add_generation_prompt is honoured from chat_template_kwargs as vLLM does; continue_final_message and the
    like would reach no template: a 400 naming them, not a prompt other than the one asked for."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is"}]
    kwargs = {"add_generation_prompt": False}
    (inp,) = chat_inputs(ChatCompletionRequest(messages=messages, chat_template_kwargs=kwargs), ctx)
    tok = ctx.tok
    assert inp.prompt == tok.encode(tok.apply_chat_template(messages, add_generation_prompt=False))
    for kwargs in ({"continue_final_message": True}, {"tokenize": True}, {"messages": []}):
        with pytest.raises(APIError) as info:
            chat_inputs(ChatCompletionRequest(messages=messages, chat_template_kwargs=kwargs), ctx)
        assert info.value.param == "chat_template_kwargs" and next(iter(kwargs)) in info.value.message


def test_the_choices_of_one_request_are_bounded(ctx):
    """prompts x n engine requests at most: a 400 naming the prompts when they alone are too many, else n with the
    range the prompts leave it."""
    assert len(completion_inputs(CompletionRequest(prompt=[[1]] * 2, n=64, max_tokens=1), ctx)) == 128
    with pytest.raises(APIError) as info:
        completion_inputs(CompletionRequest(prompt=[[1]] * 64, n=128), ctx)
    assert info.value.param == "n" and info.value.message == (
        "n=128 is out of range for 64 prompts: must be in [1, 2] (the server takes at most 128 choices per request, "
        "prompts x n: --max-choices-per-request)"
    )
    with pytest.raises(APIError) as info:
        completion_inputs(CompletionRequest(prompt=[[1]] * 2000), ctx)
    assert info.value.param == "prompt" and info.value.message.startswith("prompt holds 2000 prompts: at most 128 are")
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], n=5)
    with pytest.raises(APIError) as info:
        chat_inputs(chat, replace(ctx, max_choices=4))
    assert info.value.param == "n" and info.value.message.startswith(
        "n=5 is out of range for 1 prompt: must be in [1, 4]"
    )


def test_a_tool_conversation_renders_as_qwen3s_template_writes_it():
    """Tools in the system turn, an earlier call (its arguments a JSON string, as OpenAI sends them) with its
    thinking (vLLM's `reasoning` read as the template's `reasoning_content`), and the tool's answer as a user turn."""
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning": "Call it.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
    ]
    ctx = InputContext(Tokenizer.builtin_qwen3(), replace(LIMITS, max_model_len=4096), {})
    (inp,) = chat_inputs(ChatCompletionRequest(messages=messages, tools=tools), ctx)
    text = ctx.tok.decode(inp.prompt)
    assert text.startswith("<|im_start|>system\n# Tools\n") and f"<tools>\n{json.dumps(tools[0])}\n</tools>" in text
    assert text.endswith(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\nCall it.\n</think>\n\n"
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
