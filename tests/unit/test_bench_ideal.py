"""The ideal hit-rate model and the trace's prompt construction (pure)."""

from __future__ import annotations

from continuum_bench.fleet.ideal import IdealCache
from continuum_bench.fleet.tokens import Texts, make_codec
from continuum_bench.fleet.trace import TRACE_BLOCK, BlockTexts, synthesize
from continuum_sim.protocol.tokenizer import Tokenizer


def test_ideal_reuses_longest_prefix_whole_blocks_only() -> None:
    cache = IdealCache(None, 4)
    assert cache.on_send(list(range(10))) == 0
    assert cache.on_send(list(range(8))) == 4, "never the last token: 8 tokens fully cached still hit 1 block"
    assert cache.on_send([*range(8), 99]) == 8
    assert cache.on_send([0, 1, 2, 9, 9, 9, 9, 9]) == 0
    cache.on_complete([50, 51, 52], [53, 54, 55, 56, 57])  # prompt + answer minus its last token
    assert cache.on_send([50, 51, 52, 53, 54, 55, 56, 1]) == 4
    assert cache.prompt_tokens == 10 + 8 + 9 + 8 + 8 and cache.hit_tokens == 4 + 8 + 4


def test_ideal_capacity_evicts_least_recently_used_tail_first() -> None:
    cache = IdealCache(3, 4)
    cache.on_send(list(range(13)))  # 3 blocks: fills the cache
    cache.on_send(list(range(100, 109)))  # 2 new blocks evict the first prompt's tail blocks
    assert cache.on_send(list(range(13))) == 4, "the head block survived, its tail did not"


def test_trace_prompts_have_exact_lengths_and_shared_blocks() -> None:
    tok = Tokenizer()
    blocks = BlockTexts(Texts(make_codec("builtin")))
    text_a, a = blocks.prompt([1, 2, 3], 2 * TRACE_BLOCK + 100)
    _, b = blocks.prompt([1, 2, 7], 3 * TRACE_BLOCK)
    assert len(a) == 2 * TRACE_BLOCK + 100 and len(b) == 3 * TRACE_BLOCK
    assert (
        a[: 2 * TRACE_BLOCK] == b[: 2 * TRACE_BLOCK]
        and a[2 * TRACE_BLOCK :] != b[2 * TRACE_BLOCK : 2 * TRACE_BLOCK + 100]
    )
    assert tok.encode(text_a) == a, "the engine tokenizes the replayed text back to the same ids"


def test_synthetic_trace_shape() -> None:
    lines = synthesize(minutes=2, rate=2.0, seed=3)
    assert 150 < len(lines) < 330
    assert all(0 < x["input_length"] <= len(x["hash_ids"]) * TRACE_BLOCK for x in lines)
    assert [x["timestamp"] for x in lines] == sorted(x["timestamp"] for x in lines)
    heads = [tuple(x["hash_ids"][:2]) for x in lines]
    assert len(set(heads)) < len(heads) / 2, "prefixes are shared"
