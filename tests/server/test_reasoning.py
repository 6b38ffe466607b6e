"""The qwen3 reasoning parser: thinking apart from the answer by token ids, in the three states a template leaves a
turn in, fed token by token, and through the choice's deltas (server/choice.py) however they cut the text."""

import pytest

from qwen3_runtime.input_errors import CheckpointError
from qwen3_runtime.server.chat_output import ChatOutput, MessageDelta
from qwen3_runtime.server.reasoning import ReasoningParser, ThinkTokens
from qwen3_runtime.server.tool_parser import ToolCallTokens
from qwen3_runtime.tokenizer import IncrementalDetokenizer, Tokenizer

THINK, END = 151667, 151668
THOUGHT = "\nHmm, 2+2 is 4 🙂\n"
ANSWER = "\n\nIt is 4 (<think> and </think> are text here), «ok»."  # each tag its one token, once thinking ended


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.builtin_qwen3()


@pytest.fixture(scope="module")
def think(tok):
    return ThinkTokens.of(tok)


def prompt(tok, mode: str) -> list[int]:
    """The prompt of each template state: the model opens <think> (Qwen3's hybrid template), the template opened it
    (Qwen3-*-Thinking-2507's), or closed an empty one (enable_thinking false)."""
    messages = [{"role": "user", "content": "What is 2+2? <think>"}]  # a tag in an earlier turn counts for nothing
    kwargs = {"enable_thinking": False} if mode == "closed" else {}
    text = tok.apply_chat_template(messages, **kwargs) + ("<think>\n" if mode == "open" else "")
    return tok.encode(text)


def output(tok, mode: str, closed: bool = True) -> list[int]:
    """What a model writes in each state: thinking (cut short unless `closed`), then the answer."""
    if mode == "closed":
        return tok.encode(ANSWER)
    return [THINK] * (mode == "model") + tok.encode(THOUGHT) + ([END] + tok.encode(ANSWER) if closed else [])


def expected(mode: str, closed: bool = True) -> tuple[str, str]:
    return ("", ANSWER) if mode == "closed" else (THOUGHT, ANSWER if closed else "")


MODES = ["model", "open", "closed"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("closed", [True, False])
def test_token_by_token(tok, think, mode, closed):
    parser = ReasoningParser.for_prompt(think, prompt(tok, mode))
    detok = IncrementalDetokenizer(tok)
    reasoning = content = ""
    for t in output(tok, mode, closed):
        r, c = parser.feed(t, detok.push(t))
        reasoning, content = reasoning + r, content + c
    assert (reasoning, content) == expected(mode, closed)


def test_text_of_a_token_that_comes_later_keeps_its_part(think):
    parser = ReasoningParser(think, thinking=True)
    assert parser.feed(1, "a") == ("a", "")
    assert parser.feed(END, "") == ("", "")
    assert parser.feed(None, "</think>") == ("", "")  # the tag's text, cut off by the chunk before
    assert parser.feed(2, "b") == ("", "b")
    assert parser.feed(None, "c") == ("", "c")


def test_the_prompt_last_turn_decides(think):
    assert ReasoningParser.for_prompt(think, [1, THINK, 2]).thinking
    assert not ReasoningParser.for_prompt(think, [1]).ended
    assert ReasoningParser.for_prompt(think, [THINK, 5, END, 7]).ended
    assert not ReasoningParser.for_prompt(think, [THINK, 151644, 77091]).thinking  # before the last <|im_start|>


def stream(replay, tok, think, mode, ids, splits, stops=(), include_reasoning=True):
    out = ChatOutput(ReasoningParser.for_prompt(think, prompt(tok, mode)), include_reasoning=include_reasoning)
    return replay(tok, out, ids, splits, stops, finish="length")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stops", [(), ("\x00" * 6,)])  # a stop string never met: 5 characters held back a chunk
def test_every_split_point(replay, tok, think, mode, stops):
    """However the chunks cut the tokens and their text (inside a tag's text too), the parts join up the same: no
    tag leaks into either, nor text into the wrong one."""
    ids = output(tok, mode)
    want = expected(mode)
    for k in range(len(ids) + 1):
        for splits in ([k], list(range(1, len(ids)))):
            whole, chunks = stream(replay, tok, think, mode, ids, splits, stops)
            assert (whole.reasoning, whole.content) == want, (k, splits)
            assert all(chunk.get("reasoning") == chunk.get("reasoning_content") for chunk in chunks)


def test_the_message_not_streamed(replay, tok, think):
    ids = output(tok, "model", closed=False)
    whole, _ = stream(replay, tok, think, "model", ids, [])
    out = ChatOutput(ReasoningParser(think))
    assert out.message(whole) == {"content": None, "reasoning_content": THOUGHT, "reasoning": THOUGHT}
    assert ChatOutput().message(MessageDelta(content="")) == {"content": ""}  # no parser: as before


def test_include_reasoning_false_drops_the_thinking(replay, tok, think):
    whole, chunks = stream(replay, tok, think, "model", output(tok, "model"), [3], include_reasoning=False)
    assert (whole.reasoning, whole.content) == ("", ANSWER)
    assert all("reasoning" not in c for c in chunks)


def test_a_tokenizer_without_the_tags_is_refused_at_startup():
    class NoTags:
        def token_to_id(self, token):
            return None

    with pytest.raises(CheckpointError, match="--reasoning-parser qwen3"):
        ThinkTokens.of(NoTags())
    with pytest.raises(CheckpointError, match="--tool-call-parser hermes"):
        ToolCallTokens.of(NoTags())
