"""Precise-mode request encoding: what PromptEncoder adds to a request (`python -m continuum_bench.precise_encode`).

Tokenizer: the simulator's trained byte-level BPE (continuum_sim.hf_tokenizer, ChatML template).
Workload: `--conversations` chats under one shared system prompt (`--system-tokens`), each
growing turn by turn (user messages of 50-300 tokens, answers of 200-600) until the prompt
reaches `--target-tokens`; text from the simulator's TextGenerator (English-like words).

Reported, per request, in milliseconds (p50 / p99 over the requests of each kind):

* **warm** — the encoder has seen the conversation's previous turn (the steady state of
  multi-turn traffic): every turn, and separately the last turns (the ~12k-token requests);
* **new conversation** — a conversation's first turn when another conversation already brought
  the shared system prompt into the cache;
* **cold** — a fresh encoder (empty caches) on a ~12k-token request;
* **baseline** — no encoder: the whole text through the tokenizer and every block rehashed.

Before the table, what the filled cache costs the cyclic collector: the objects it leaves
tracked and the time of a full collection (which pauses the ingress's event loop).

Each line splits the time into render (the Jinja2 chat template), tokenize (chunk lookups and
tokenizer calls), hash (block hashing) and other (splitting, chain-node lookups); "total" is
render + encode. Then the block hashers alone: µs per 16-token block over a 12k-token chain,
and what the simulated engine spends turning the same chat requests into ids (render + encode,
every turn in order): with the built-in tokenizer, with `--tokenizer` (span cache), and the
Hugging Face tokenizer on whole texts.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from continuum_common.hashing.blocks import BlockHasher, make_block_hasher
from continuum_common.tokenization import LocalTokenizer, PromptEncoder
from continuum_sim.hf_tokenizer import train_tokenizer
from continuum_sim.protocol.chat_template import ChatMessage
from continuum_sim.protocol.codec import BuiltinCodec, HfCodec, PromptCodec
from continuum_sim.protocol.generation import TextGenerator
from continuum_sim.protocol.tokenizer import Tokenizer

Messages = list[dict[str, str]]


@dataclass
class Sample:
    tokens: int
    render: float
    tokenize: float
    hash: float
    encode: float

    @property
    def total(self) -> float:
        return self.render + self.encode

    @property
    def other(self) -> float:
        return self.encode - self.tokenize - self.hash


@dataclass
class Kind:
    name: str
    samples: list[Sample] = field(default_factory=list)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Texts:
    """English-like text of about `n` tokens (the builtin tokenizer's count; the trained BPE
    gives about the same, one token per word)."""

    def __init__(self, seed: int) -> None:
        self._tok = Tokenizer(cache_size=0)
        self._gen = TextGenerator(self._tok)
        self._rng = random.Random(seed)

    def __call__(self, n: int) -> str:
        return self._tok.decode(self._gen.tokens(n, self._rng))

    def between(self, low: int, high: int) -> str:
        return self(self._rng.randint(low, high))


def conversation(texts: Texts, system: str, target_tokens: int, count: Callable[[str], int]) -> list[Messages]:
    """The message list of every turn of one conversation, until the prompt reaches the target
    (counted per message with the real tokenizer, plus 5 template tokens per message)."""
    messages: Messages = [{"role": "system", "content": system}]
    total = count(system) + 5
    turns: list[Messages] = []
    while True:
        user = texts.between(50, 300)
        messages.append({"role": "user", "content": user})
        total += count(user) + 5
        turns.append(list(messages))
        if total >= target_tokens:
            return turns
        answer = texts.between(200, 600)
        messages.append({"role": "assistant", "content": answer})
        total += count(answer) + 5


def measure(encoder: PromptEncoder, tokenizer: LocalTokenizer, messages: Messages) -> Sample:
    started = time.perf_counter()
    text = tokenizer.render_chat(messages)
    rendered = time.perf_counter()
    tok0, hash0 = encoder.stats.tokenize_seconds, encoder.stats.hash_seconds
    prompt = encoder.encode(text, add_special_tokens=False)
    done = time.perf_counter()
    return Sample(
        prompt.token_count,
        render=rendered - started,
        tokenize=encoder.stats.tokenize_seconds - tok0,
        hash=encoder.stats.hash_seconds - hash0,
        encode=done - rendered,
    )


def baseline(tokenizer: LocalTokenizer, hasher: BlockHasher, messages: Messages) -> Sample:
    started = time.perf_counter()
    text = tokenizer.render_chat(messages)
    rendered = time.perf_counter()
    ids = tokenizer.encode(text, add_special_tokens=False)
    tokenized = time.perf_counter()
    digests = hasher.chain(ids)
    [hasher.wire(d) for d in digests]
    done = time.perf_counter()
    return Sample(len(ids), rendered - started, tokenized - rendered, done - tokenized, done - rendered)


def build_chats(args: argparse.Namespace, tokenizer: LocalTokenizer) -> list[list[Messages]]:
    texts = Texts(args.seed)
    system = texts(args.system_tokens)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return [conversation(texts, system, args.target_tokens, count) for _ in range(args.conversations)]


def run(args: argparse.Namespace, tokenizer: LocalTokenizer, chats: list[list[Messages]]) -> list[Kind]:
    hasher = make_block_hasher("vllm", args.block_size, hash_seed="0")
    warm, last, first, cold, base = Kind("warm, every turn"), Kind("warm, last turn"), Kind("new conversation"), \
        Kind("cold (empty encoder)"), Kind("baseline: whole text + full rehash")  # fmt: skip
    empty = collector_state()
    encoder = PromptEncoder(tokenizer, hasher, max_cache_bytes=args.cache_mb << 20)
    measure(encoder, tokenizer, chats[0][0])  # the system prompt enters the cache
    for chat in chats:
        for index, messages in enumerate(chat):
            sample = measure(encoder, tokenizer, messages)
            (first if index == 0 else warm).samples.append(sample)
            if index == len(chat) - 1:
                last.samples.append(sample)
    collector_costs(encoder, empty)
    for chat in chats[: args.cold_samples]:
        cold.samples.append(measure(PromptEncoder(tokenizer, hasher), tokenizer, chat[-1]))
        base.samples.append(baseline(tokenizer, hasher, chat[-1]))
    return [warm, last, first, cold, base]


def collector_state() -> tuple[int, float]:
    """Objects the cyclic collector tracks (the samples this benchmark keeps left out), and the
    median time of a full collection (ms)."""
    for _ in range(3):  # nested tuples leave the collector's view one collection after their items
        gc.collect()
    times = []
    for _ in range(5):
        started = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - started)
    tracked = sum(1 for o in gc.get_objects() if not isinstance(o, Sample))
    return tracked, statistics.median(times) * 1e3


def collector_costs(encoder: PromptEncoder, empty: tuple[int, float]) -> None:
    """What the filled cache costs the cyclic collector: the objects it leaves tracked and the
    full collection's time (a collection pauses the ingress's event loop)."""
    tracked, full_ms = collector_state()
    print(
        f"collector: with the cache filled ({encoder.cache_bytes / 2**20:.1f} MiB) the process tracks "
        f"{tracked - empty[0]:+,} objects and a full collection takes {full_ms:.1f} ms "
        f"(before the encoder: {empty[1]:.1f} ms)\n"
    )


def report(kinds: list[Kind]) -> None:
    """One markdown table row per kind of request: p50 / p99 in ms of each part."""
    print("| requests | n | tokens (p50) | total | render | tokenize | hash | other |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind in kinds:
        s = kind.samples
        if not s:
            continue

        def cell(values: list[float]) -> str:
            return f"{pct(values, 0.5) * 1e3:.2f} / {pct(values, 0.99) * 1e3:.2f}"

        parts = [[x.total for x in s], [x.render for x in s], [x.tokenize for x in s], [x.hash for x in s],
                 [x.other for x in s]]  # fmt: skip
        tokens = statistics.median(x.tokens for x in s)
        print(f"| {kind.name} | {len(s)} | {tokens:.0f} | " + " | ".join(cell(p) for p in parts) + " |")


def hasher_costs(block_size: int, tokens: int, repeats: int) -> None:
    rng = random.Random(0)
    ids = [rng.randrange(0, 150_000) for _ in range(tokens)]
    small = [rng.randrange(0, 60_000) for _ in range(tokens)]
    print(f"\nblock hashers, {tokens // block_size} blocks of {block_size} tokens (median of {repeats}):")
    cases = [
        ("vllm sha256_cbor, ids < 60k", make_block_hasher("vllm", block_size, hash_seed="0"), small),
        ("vllm sha256_cbor, ids < 150k", make_block_hasher("vllm", block_size, hash_seed="0"), ids),
        ("vllm sha256 (pickle)", make_block_hasher("vllm", block_size, hash_seed="0", vllm_hash_algo="sha256"), ids),
        ("sglang / trtllm", make_block_hasher("sglang", block_size), ids),
    ]
    for name, hasher, tokens_ in cases:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            digests = hasher.chain(tokens_)
            [hasher.wire(d) for d in digests]
            times.append(time.perf_counter() - started)
        print(f"  {name:<30} {statistics.median(times) / len(digests) * 1e6:6.2f} µs/block")


def sim_codec_costs(tokenizer: LocalTokenizer, chats: list[list[Messages]]) -> None:
    """The simulated engine's render + encode of every chat request, per codec."""

    def hf_whole(messages: list[ChatMessage]) -> list[int]:
        return tokenizer.encode(tokenizer.render_chat([{"role": m.role, "content": m.content} for m in messages]),
                                add_special_tokens=False)  # fmt: skip

    codecs: list[tuple[str, PromptCodec | None]] = [
        ("built-in tokenizer", BuiltinCodec(Tokenizer())),
        ("--tokenizer (span cache)", HfCodec(tokenizer)),
        ("Hugging Face, whole texts", None),
    ]
    print("\nsimulated engine, render + encode per chat request, every turn (ms p50 / p99):")
    for name, codec in codecs:
        times = []
        for chat in chats:
            for raw in chat:
                messages = [ChatMessage(m["role"], m["content"]) for m in raw]
                started = time.perf_counter()
                if codec is None:
                    hf_whole(messages)
                else:
                    codec.encode(codec.render_chat(messages), add_special_tokens=False)
                times.append(time.perf_counter() - started)
        print(f"  {name:<28} {pct(times, 0.5) * 1e3:7.2f} / {pct(times, 0.99) * 1e3:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=40)
    parser.add_argument("--system-tokens", type=int, default=6000)
    parser.add_argument("--target-tokens", type=int, default=12_000)
    parser.add_argument("--cold-samples", type=int, default=10)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--cache-mb", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sim-conversations", type=int, default=10, help="conversations for the simulator part")
    parser.add_argument("--tokenizer-dir", help="reuse (or write) the trained tokenizer here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.tokenizer_dir or tmp)
        files = train_tokenizer(out) if not (out / "tokenizer.json").exists() else None
        tokenizer = LocalTokenizer(out / "tokenizer.json", chat_template=out / "chat_template.jinja")
        if files is not None:
            print(f"trained tokenizer: {tokenizer.vocab_size} tokens")
        encoder_check = PromptEncoder(tokenizer, make_block_hasher("vllm", args.block_size, hash_seed="0"))
        print(f"piecewise encoding: {encoder_check.piecewise} {encoder_check.support.reason}".rstrip())
        chats = build_chats(args, tokenizer)
        report(run(args, tokenizer, chats))
        hasher_costs(args.block_size, args.target_tokens, 9)
        sim_codec_costs(tokenizer, chats[: args.sim_conversations])


if __name__ == "__main__":
    main()
