"""/tokenize and /detokenize without a server: the ids a completion or chat request would give the model."""

import pytest
from pydantic import ValidationError

from qwen3_runtime.params import RequestLimits
from qwen3_runtime.server.errors import APIError
from qwen3_runtime.server.inputs import chat_inputs, chat_prompt
from qwen3_runtime.server.protocol import ChatCompletionRequest
from qwen3_runtime.server.state import ServerState
from qwen3_runtime.server.tokenization import detokenize, tokenize
from qwen3_runtime.server.tokenize_protocol import DetokenizeRequest, TokenizeRequest
from qwen3_runtime.tokenizer import Tokenizer

LIMITS = RequestLimits(vocab_size=151936, max_model_len=64, max_logprobs=5)


@pytest.fixture(scope="module")
def state():
    return ServerState(None, Tokenizer.builtin_qwen3(), "tiny", LIMITS, {}, None)


def test_text_and_chat_give_the_ids_a_request_would(state):
    tok = state.tokenizer
    text = tokenize(TokenizeRequest(prompt="Hello world"), state)
    assert text == {"count": 2, "max_model_len": 64, "tokens": tok.encode("Hello world"), "token_strs": None}
    chat = {"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"enable_thinking": False}}
    (request,) = chat_inputs(ChatCompletionRequest(**chat), state.inputs)
    assert tokenize(TokenizeRequest(**chat), state)["tokens"] == request.prompt
    bare = tokenize(TokenizeRequest(**chat, add_generation_prompt=False), state)["tokens"]
    assert request.prompt[: len(bare)] == bare and len(bare) < len(request.prompt)


@pytest.mark.parametrize(
    "body, param",
    [
        ({}, "prompt"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
        ({"prompt": "a", "return_token_strs": True}, "return_token_strs"),
        # vLLM's chat fields the chat endpoint refuses: ignored, the ids would be those of another prompt
        ({"messages": [{"role": "user", "content": "b"}], "continue_final_message": True}, "continue_final_message"),
        ({"messages": [{"role": "user", "content": "b"}], "chat_template": "{{ 'x' }}"}, "chat_template"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0].type"),
    ],
)
def test_a_bad_tokenize_body_names_the_field(body, param):
    with pytest.raises(ValidationError) as info:
        TokenizeRequest(**body)
    assert info.value.errors()[0]["ctx"]["param"] == param


def test_tools_are_rendered_as_a_chat_request_renders_them(state):
    chat = {"messages": [{"role": "user", "content": "Hi"}]}
    tools = [{"type": "function", "function": {"name": "now", "description": "The time"}}]
    prompt = chat_prompt(ChatCompletionRequest(**chat, tools=tools), state.tokenizer)  # what chat_inputs sends
    assert tokenize(TokenizeRequest(**chat, tools=tools), state)["tokens"] == prompt
    assert len(prompt) > tokenize(TokenizeRequest(**chat), state)["count"]
    assert '{"type": "function", "function": {"name": "now", "description": "The time"}}' in state.tokenizer.decode(
        prompt
    )


def test_detokenize_is_decode_and_checks_the_ids(state):
    ids = state.tokenizer.encode("Hello <|im_end|> world")
    assert detokenize(DetokenizeRequest(tokens=ids), state) == {"prompt": "Hello <|im_end|> world"}
    with pytest.raises(APIError) as info:
        detokenize(DetokenizeRequest(tokens=[1, 151936]), state)
    assert info.value.param == "tokens" and "tokens[1]=151936" in info.value.message
