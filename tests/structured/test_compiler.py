"""ConstraintCompiler over Qwen3's real tokenizer: what xgrammar sees of the vocabulary, compact JSON (no whitespace
to loop on), the cache, and xgrammar's refusals as errors naming the request's field."""

import threading
import time

import pytest

pytest.importorskip("xgrammar")

from qwen3_runtime.structured.compiler import ConstraintCompiler, choice_grammar, tokenizer_info  # noqa: E402
from qwen3_runtime.structured.matcher import ConstraintMatcher  # noqa: E402
from qwen3_runtime.structured.spec import GrammarCompileError, OutputConstraint  # noqa: E402
from tests.structured.conftest import EOS, VOCAB, allowed, drive  # noqa: E402

WHITESPACE = (220, 198, 256, 271, 197)  # " ", "\n", "  ", "\n\n", "\t"


def test_the_vocabulary_xgrammar_sees(compiler, tok):
    info = compiler.info
    assert info.vocab_size == VOCAB and sorted(info.stop_token_ids) == sorted(EOS)
    never = set(range(tok.vocab_size, VOCAB)) | (tok.special_ids - set(EOS))  # no text: never allowed
    assert never <= set(info.special_token_ids)
    decoded = info.decoded_vocab
    assert decoded[220] == b" " and decoded[151667] == b"<think>" and decoded[151657] == b"<tool_call>"
    assert decoded[151644] == b""  # <|im_start|>: special, so never text


def test_a_vocabulary_smaller_than_the_tokenizer_is_cut(tok):
    info = tokenizer_info(tok, 512, [151645, 7])  # a tiny test model with Qwen3's tokenizer
    assert info.vocab_size == 512 and info.stop_token_ids == [7]
    with pytest.raises(ValueError, match=r"stop_token_ids=\[151645\] is invalid"):
        tokenizer_info(tok, 512, [151645])


@pytest.mark.parametrize(
    "constraint",
    [OutputConstraint.json_object(), OutputConstraint.json_schema({"type": "object", "properties": {"a": {}}})],
    ids=["json_object", "schema"],
)
def test_json_allows_no_whitespace_but_the_separators(compiler, tok, constraint):
    """With free whitespace models loop on it until max_tokens (vLLM #17393): only ", " and ": " have a space."""
    matcher = ConstraintMatcher(compiler.compile(constraint))
    assert not set(WHITESPACE) & set(allowed(matcher))  # before the "{"
    drive(matcher, tok.encode("{"))
    assert not set(WHITESPACE) & set(allowed(matcher))
    drive(matcher, tok.encode('"a":'))
    assert set(allowed(matcher)) & set(WHITESPACE) == {220}  # the separator's one space
    drive(matcher, [220])
    assert not set(WHITESPACE) & set(allowed(matcher))
    drive(matcher, tok.encode('[1, {"b": null}]'))
    assert not set(WHITESPACE) & set(allowed(matcher))


def test_the_same_constraint_compiles_once(compiler):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}
    first = compiler.submit(OutputConstraint.json_schema(schema))
    grammar = first.result()
    start = time.perf_counter()
    again = compiler.submit(OutputConstraint.json_schema(dict(schema), field="response_format"))
    assert again.done() and again.result() is grammar  # no new compilation: the first one's result at once
    assert time.perf_counter() - start < 0.01
    assert compiler.submit(OutputConstraint.json_schema({**schema, "required": []})).result() is not grammar


def test_the_cache_keeps_the_latest_constraints(tok):
    small = ConstraintCompiler(tok, 512, [7], cache_size=2)
    a, b, c = (OutputConstraint.regex(p) for p in ("a", "b", "c"))
    grammar_a = small.compile(a)
    small.compile(b)
    assert small.compile(a) is grammar_a  # a hit moves it to the back ...
    small.compile(c)  # ... so b is evicted, not a
    assert small.compile(a) is grammar_a
    assert len(small._cache) == 2 and b not in small._cache
    small.close()


@pytest.mark.parametrize(
    "constraint, says",
    [
        (OutputConstraint.json_schema({"type": "strin"}, field="response_format"), 'Unsupported type "strin"'),
        (OutputConstraint.json_schema({"$ref": "#/$defs/gone"}), "Cannot find field '$defs'"),
        (OutputConstraint.json_schema({"type": "integer", "minimum": 5, "maximum": 1}), "minimum greater than"),
        (
            OutputConstraint.json_schema({"items": [{"pattern": "(?!x)."}]}),
            "lookahead is not supported (in the pattern '(?!x).')",
        ),
        (OutputConstraint.regex("(a", field="guided_regex"), "The parenthesis is not closed"),
        (OutputConstraint.regex("(?<=a)b"), "Lookbehind is not supported"),
        (OutputConstraint.grammar("root ::= rest"), 'Rule "rest" is not defined'),
        (OutputConstraint.grammar('start ::= "a"'), 'root rule with name "root" is not found'),
    ],
)
def test_what_xgrammar_refuses_is_an_error_naming_the_field(compiler, constraint, says):
    with pytest.raises(GrammarCompileError) as caught:
        compiler.compile(constraint)
    message = str(caught.value)
    assert caught.value.field == constraint.field and message.startswith(f"{constraint.field}=")
    assert "is invalid: xgrammar: " in message and says in message and ".cc:" not in message, message


def test_a_cached_refusal_names_each_asking_field(compiler):
    with pytest.raises(GrammarCompileError, match=r"^guided_regex='\[a' is invalid"):
        compiler.compile(OutputConstraint.regex("[a", field="guided_regex"))
    with pytest.raises(GrammarCompileError, match=r"^structured_outputs\.regex='\[a' is invalid"):
        compiler.compile(OutputConstraint.regex("[a"))


def test_choices_are_escaped_literals(compiler, tok):
    choices = ['say "hi"', "back\\slash", "two\nlines", "tab\tand\x01", "ünï😀"]
    assert choice_grammar(['a"b']) == r'root ::= "a\"b"'
    grammar = compiler.compile(OutputConstraint.choice(choices))
    for choice in choices:
        matcher = ConstraintMatcher(grammar)
        drive(matcher, tok.encode(choice))
        assert set(allowed(matcher)) == set(EOS)  # nothing can follow a whole choice
    matcher = ConstraintMatcher(grammar)
    drive(matcher, tok.encode("say"))
    assert not matcher.accept(tok.encode(" hi")[0])  # the quote must come first


def test_compiling_runs_in_the_worker_thread(tok):
    small = ConstraintCompiler(tok, 512, [7])
    real, names = small._compiler, []

    class Recording:
        def compile_regex(self, pattern: str):
            names.append(threading.current_thread().name)
            return real.compile_regex(pattern)

    small._compiler = Recording()
    small.compile(OutputConstraint.regex("a+"))
    assert names[0].startswith("grammar-compile") and names[0] != threading.current_thread().name
    small.close()


def test_closing_cancels_what_has_not_started(tok):
    small = ConstraintCompiler(tok, 512, [7])
    started, release = threading.Event(), threading.Event()
    real = small._compiler

    class Blocking:
        def compile_regex(self, pattern: str):
            started.set()
            release.wait()
            return real.compile_regex(pattern)

    small._compiler = Blocking()
    running, waiting = small.submit(OutputConstraint.regex("a")), small.submit(OutputConstraint.regex("b"))
    started.wait()
    small.close()
    release.set()
    assert running.result() is not None and waiting.cancelled()
