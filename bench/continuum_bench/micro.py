"""Micro-benchmarks of the Tier 1/2 hot-path primitives (`python -m continuum_bench.micro`).

Prints µs/op for: the prefix key of a 1 KiB system prompt, a CHWBL lookup with 16 backends ×
150 virtual nodes, and the response-cache key of a ~2 KiB message list. Targets are the seed's
figures: prefix key < 10 µs, ring lookup < 5 µs, cache key < 5 µs. Also the KV scorer's reading
of a streamed chat answer (continuum_ingress/kv/answers.py), per chunk of a 120-chunk answer in
vLLM's chunk format, reader included: budget < 5 µs (set with this benchmark; it runs on the
event loop for every chunk of every chat stream). And the answer filter that cuts the token ids
vLLM returns with an answer (`return_token_ids`, continuum_ingress/kv/answer_ids.py) out of
what the client receives: per chunk of the same answer carrying its `token_ids` (budget < 5 µs,
as the reader's), the first chunk carrying a 12,000-token prompt's `prompt_token_ids` (budget
< 100 µs: a few µs per KiB), and parsing those ids when they are learnt from (no budget; once
per request, after the answer, in place of a `/tokenize` call).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import time
from collections.abc import Callable

import orjson

from continuum_common.hashing import request_prefix_key, response_cache_key
from continuum_common.ring import HashRing
from continuum_ingress.kv.answer_ids import AnswerIds
from continuum_ingress.kv.answers import AnswerReader

TARGETS_US = {
    "prefix_key_1KiB": 10.0,
    "ring_lookup_16x150": 5.0,
    "cache_key_2KiB": 5.0,
    "answer_chunk": 5.0,
    "answer_ids_chunk": 5.0,
    "answer_ids_prompt_12k": 100.0,
    "answer_ids_parse_12k": float("inf"),
}
ANSWER_CHUNKS = 120
PROMPT_TOKENS = 12_000


def _stream_chunks(**choice: object) -> list[bytes]:
    """ANSWER_CHUNKS chunks of a streamed chat answer in vLLM's format, each choice with `choice`
    added (`token_ids=True`: the chunk's one token id, as with `return_token_ids`)."""
    out = []
    for i in range(ANSWER_CHUNKS):
        extra = {"token_ids": [1000 + i]} if choice.get("token_ids") else {}
        body = {
            "id": "chatcmpl-5f1e0c2a9b",
            "object": "chat.completion.chunk",
            "created": 1733300000,
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "choices": [
                {"index": 0, "delta": {"content": f" token{i}"}, "logprobs": None, "finish_reason": None, **extra}
            ],
        }
        out.append(b"data: " + orjson.dumps(body) + b"\n\n")
    return out


def _answer_chunks() -> Callable[[], object]:
    """Feeds one chunk of a streamed answer per call; a new reader every ANSWER_CHUNKS + 1."""
    chunks = _stream_chunks()
    chunks.append(b"data: [DONE]\n\n")
    reader = AnswerReader(stream=True)
    position = 0

    def feed() -> object:
        nonlocal reader, position
        reader.feed(chunks[position])
        if position < ANSWER_CHUNKS:
            position += 1
            return None
        text = reader.text()
        reader, position = AnswerReader(stream=True), 0
        return text

    return feed


def _answer_ids_chunks() -> Callable[[], object]:
    """Passes one chunk of a streamed answer with its `token_ids` through the filter per call;
    a new filter every ANSWER_CHUNKS."""
    chunks = _stream_chunks(token_ids=True)
    ids = AnswerIds(lambda _: True)
    position = 0

    def feed() -> object:
        nonlocal ids, position
        out = ids.chunk(chunks[position])
        position += 1
        if position == ANSWER_CHUNKS:
            ids, position = AnswerIds(lambda _: True), 0
            ids.begin(strip=True)
        return out

    ids.begin(strip=True)
    return feed


def _prompt_chunk() -> bytes:
    rng = random.Random(3)
    prompt = [rng.randrange(151_000) for _ in range(PROMPT_TOKENS)]
    role = {
        "id": "chatcmpl-5f1e0c2a9b",
        "object": "chat.completion.chunk",
        "created": 1733300000,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}],
        "prompt_token_ids": prompt,
    }
    return b"data: " + orjson.dumps(role) + b"\n\n"


def _answer_ids_prompt() -> Callable[[], object]:
    """Cuts a 12,000-token prompt's ids out of a stream's first chunk."""
    chunk = _prompt_chunk()

    def cut() -> object:
        ids = AnswerIds(lambda _: True)
        ids.begin(strip=True)
        return ids.chunk(chunk)

    return cut


def _answer_ids_parse() -> Callable[[], object]:
    """Parses the ids cut above, as when they are learnt from."""
    ids = AnswerIds(lambda _: True)
    ids.begin(strip=True)
    ids.chunk(_prompt_chunk())
    return ids.prompt


def _time_per_op(fn: Callable[[], object], number: int, repeats: int) -> list[float]:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - start) / number * 1e6)
    return runs


def _fixtures() -> dict[str, Callable[[], object]]:
    rng = random.Random(7)
    words = [f"word{i}" for i in range(200)]
    system = " ".join(rng.choice(words) for _ in range(400))[:1024]
    chat = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "What now?"}],
    }

    ring = HashRing([f"backend-{i}" for i in range(16)], virtual_nodes=150, epsilon=0.25)
    keys = [hashlib.sha256(str(i).encode()).digest() for i in range(1024)]
    loads = {f"backend-{i}": rng.randint(0, 8) for i in range(16)}
    counter = iter(range(1 << 62))

    turn = " ".join(rng.choice(words) for _ in range(60))
    messages = [{"role": "user" if i % 2 else "assistant", "content": turn[:220]} for i in range(8)]
    body = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": messages,
        "temperature": 0,
        "max_tokens": 256,
        "top_p": 1.0,
        "seed": 1,
    }
    size = len(str(messages).encode())

    return {
        "prefix_key_1KiB": lambda: request_prefix_key(chat, enabled=True, max_prefix_length=1024),
        "ring_lookup_16x150": lambda: ring.lookup(keys[next(counter) & 1023], "m", loads),
        "cache_key_2KiB": (lambda: response_cache_key(body, tenant_id="tenant-a")),
        "answer_chunk": _answer_chunks(),
        "answer_ids_chunk": _answer_ids_chunks(),
        "answer_ids_prompt_12k": _answer_ids_prompt(),
        "answer_ids_parse_12k": _answer_ids_parse(),
        "_cache_key_bytes": lambda: size,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    benches = _fixtures()
    size = benches.pop("_cache_key_bytes")()
    print(f"{'benchmark':<22} {'best µs/op':>11} {'median':>9} {'target':>8}  verdict")
    for name, fn in benches.items():
        # the 12k-token cases take ~100× longer per op: ~100× fewer ops
        number = max(10, args.number // 100) if name.endswith("_12k") else args.number
        for _ in range(min(2000, number)):  # warm caches (ring walks, allocator)
            fn()
        runs = _time_per_op(fn, number, args.repeats)
        best, median = min(runs), statistics.median(runs)
        target = TARGETS_US[name]
        verdict = "-" if target == float("inf") else "ok" if median < target else "OVER TARGET"
        print(f"{name:<22} {best:>11.2f} {median:>9.2f} {target:>8.1f}  {verdict}")
    print(f"(cache key message list: {size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
