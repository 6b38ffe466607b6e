"""Qwen3 tokenization: a checkpoint's tokenizer, or the built-in Qwen3 one (builtin.py), and streaming
detokenization."""

from qwen3_runtime.tokenizer.builtin import QWEN3_ADDED_TOKENS
from qwen3_runtime.tokenizer.core import Tokenizer, load_tokenizer
from qwen3_runtime.tokenizer.detokenizer import IncrementalDetokenizer, detokenize

__all__ = ["QWEN3_ADDED_TOKENS", "IncrementalDetokenizer", "Tokenizer", "detokenize", "load_tokenizer"]
