import hashlib
import struct

from qwen3_runtime import SamplingParams
from qwen3_runtime.block_hash import ROOT, extend_block_hashes, hash_block, token_range
from qwen3_runtime.request import PENDING, Request


def test_a_block_hash_is_a_digest_of_its_parent_and_its_little_endian_tokens():
    expected = hashlib.blake2b(b"p" * 32 + struct.pack("<2q", 1, 2**40), digest_size=32).digest()
    assert hash_block(b"p" * 32, [1, 2**40]) == expected
    assert hash_block(ROOT, [1, 2]) != hash_block(hash_block(ROOT, [1, 2]), [1, 2])


def test_token_ranges_cross_from_prompt_to_output():
    req = Request(0, [1, 2, 3], SamplingParams(), seed=0, output=[4, 5])
    assert [token_range(req, a, b) for a, b in [(0, 2), (1, 4), (3, 5), (0, 5)]] == [
        [1, 2],
        [2, 3, 4],
        [4, 5],
        req.tokens,
    ]


def test_hashes_extend_over_known_full_blocks_and_stop_at_a_pending_slot():
    req = Request(0, [1, 2, 3, 4, 5], SamplingParams(), seed=0)
    assert extend_block_hashes(req, 5, 2) == req.block_hashes
    first, second = hash_block(ROOT, [1, 2]), hash_block(hash_block(ROOT, [1, 2]), [3, 4])
    assert req.block_hashes == [first, second]
    assert extend_block_hashes(req, 3, 2) == [first, second]  # never shortened
    req.output += [6, PENDING]
    assert extend_block_hashes(req, 7, 2) == [first, second, hash_block(second, [5, 6])]
    assert extend_block_hashes(req, 8, 2) == req.block_hashes and len(req.block_hashes) == 3
    req.output[-1] = 7
    req.output.append(8)
    assert extend_block_hashes(req, 8, 2)[3] == hash_block(req.block_hashes[2], [7, 8])
