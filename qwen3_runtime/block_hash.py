"""Prefix-cache keys: a full block's key hashes its tokens with the key of the block before it, so equal
keys mean equal token prefixes (and so equal KV), not merely equal blocks."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from qwen3_runtime.request import PENDING, Request

ROOT = b""  # the parent of a sequence's first block: shorter than any digest, so never confused with one


def hash_block(parent: bytes, tokens: Sequence[int]) -> bytes:
    """A digest, not Python's hash(): keys are shared across requests, and a collision would serve one
    prompt another's KV."""
    data = parent + struct.pack(f"<{len(tokens)}q", *tokens)
    return hashlib.blake2b(data, digest_size=32).digest()


def token_range(req: Request, start: int, end: int) -> list[int]:
    """req.tokens[start:end] without joining prompt and output."""
    num_prompt = len(req.prompt)
    if end <= num_prompt:
        return req.prompt[start:end]
    if start >= num_prompt:
        return req.output[start - num_prompt : end - num_prompt]
    return req.prompt[start:] + req.output[: end - num_prompt]


def extend_block_hashes(req: Request, num_tokens: int, block_size: int) -> list[bytes]:
    """req.block_hashes, extended over the full blocks among its first `num_tokens` tokens; stops before a
    block holding a PENDING slot. Kept on the request, so each block is hashed once."""
    hashes = req.block_hashes
    while (len(hashes) + 1) * block_size <= num_tokens:
        start = len(hashes) * block_size
        tokens = token_range(req, start, start + block_size)
        if PENDING in tokens:
            break
        hashes.append(hash_block(hashes[-1] if hashes else ROOT, tokens))
    return hashes
