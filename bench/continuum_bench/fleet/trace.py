"""Mooncake-format trace replay, and the generator of the synthetic trace in bench/continuum_bench/traces/.

Format (one JSON object per line, as in kvcache-ai/Mooncake's traces):
`{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [int, ...]}` where
hash_ids name the prompt's 512-token blocks: equal ids mean equal block contents, so requests
that share leading ids share a prefix.

Replay turns each line into a `/v1/completions` request whose prompt is real text: block id `h`
is 512 tokens of deterministic English drawn with seed `h` (the last block is cut to make
`input_length` exact; exact with the builtin tokenizer, to a token or two with a Hugging Face
one), so equal hash_ids give equal text and equal token ids on the engine.
Requests start at `timestamp` (time-scaled by the driver); they are independent of each other.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from continuum_bench.fleet.workloads import BenchRequest, Texts
from continuum_bench.fleet.workloads import Session as SessionProto

TRACE_BLOCK = 512
DEFAULT_TRACE = Path(__file__).resolve().parent.parent / "traces" / "mooncake_synthetic.jsonl"


@dataclass(frozen=True)
class TraceLine:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp_ms, "input_length": self.input_length,
            "output_length": self.output_length, "hash_ids": list(self.hash_ids),
        }  # fmt: skip


def load_trace(
    path: str | Path, *, limit: int | None = None, duration_s: float | None = None, start_s: float = 0.0
) -> list[TraceLine]:
    """Read a Mooncake JSONL trace (ValueError naming the line on a malformed one). With
    `start_s`, the window that begins there: earlier lines are left out and the rest are moved
    back by `start_s`, so the window's first request comes at once; `duration_s` and `limit`
    count from the window's start."""
    lines: list[TraceLine] = []
    start_ms = round(start_s * 1000)
    with open(path, encoding="utf-8") as fh:
        for number, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                line = _parse_line(json.loads(raw))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a Mooncake trace line ({type(exc).__name__}: {exc})") from exc
            if line.timestamp_ms < start_ms:
                continue
            if start_ms:
                line = dataclasses.replace(line, timestamp_ms=line.timestamp_ms - start_ms)
            if duration_s is not None and line.timestamp_ms > duration_s * 1000:
                break
            lines.append(line)
            if limit is not None and len(lines) >= limit:
                break
    return lines


def _parse_line(item: Any) -> TraceLine:
    hash_ids = tuple(int(h) for h in item["hash_ids"])
    line = TraceLine(int(item["timestamp"]), int(item["input_length"]), int(item["output_length"]), hash_ids)
    if line.input_length < 1 or line.output_length < 0 or not hash_ids:
        raise ValueError("input_length must be >= 1, output_length >= 0 and hash_ids non-empty")
    return line


def write_trace(path: Path, lines: Sequence[TraceLine]) -> None:
    """Mooncake JSONL, one request per line (what `load_trace` reads back)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(json.dumps(line.to_json(), separators=(",", ":")) + "\n")


class BlockTexts:
    """Token ids of trace blocks by hash id (bounded LRU: a long trace must not grow memory)."""

    def __init__(self, texts: Texts, capacity: int = 2048) -> None:
        self.texts = texts
        self.capacity = capacity
        self._cache: OrderedDict[int, list[int]] = OrderedDict()

    def block(self, hash_id: int) -> list[int]:
        ids = self._cache.get(hash_id)
        if ids is None:
            ids = self.texts.codec.generate(TRACE_BLOCK, random.Random(hash_id), leading_space=True)
            self._cache[hash_id] = ids
            if len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(hash_id)
        return ids

    def prompt(self, hash_ids: Sequence[int], input_length: int) -> tuple[str, list[int]]:
        """The prompt text of `input_length` tokens made of these blocks, and its token ids as
        the engine will tokenize it (with a Hugging Face tokenizer a cut word at a block's end
        can tokenize differently inside the whole text: the ids are those of the text)."""
        codec = self.texts.codec
        need = max(1, -(-input_length // TRACE_BLOCK))
        ids = [token for h in hash_ids[:need] for token in self.block(h)][: max(input_length, 1)]
        text = codec.decode(ids)
        return text, ids if codec.exact else codec.encode(text)


@dataclass
class _TraceSession:
    blocks: BlockTexts
    line: TraceLine
    max_model_len: int
    start: float = field(init=False)
    done: bool = False

    def __post_init__(self) -> None:
        self.start = self.line.timestamp_ms / 1000.0

    def next_request(self, previous_answer: str | None) -> BenchRequest | None:
        if self.done:
            return None
        self.done = True
        out = max(1, self.line.output_length)
        text, ids = self.blocks.prompt(self.line.hash_ids, min(self.line.input_length, self.max_model_len - out))
        return BenchRequest("completions", {"prompt": text, "max_tokens": out}, ids, out)

    def think_time(self) -> float:
        return 0.0


def _display_path(path: str | Path) -> str:
    """Relative to the working directory when possible (reports are committed)."""
    with contextlib.suppress(ValueError):
        return str(Path(path).resolve().relative_to(Path.cwd()))
    return str(path)


@dataclass
class TraceWorkload:
    texts: Texts
    path: str | Path = DEFAULT_TRACE
    limit: int | None = None
    duration: float | None = None  # simulated seconds of trace to replay
    start: float = 0.0  # trace second the replay begins at
    max_model_len: int = 32_768
    name: str = "trace"
    _lines: list[TraceLine] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._lines = load_trace(self.path, limit=self.limit, duration_s=self.duration, start_s=self.start)
        if not self._lines:
            raise ValueError(f"trace {self.path} has no requests in the selected range")

    @property
    def total_requests(self) -> int:
        return len(self._lines)

    def describe(self) -> dict[str, Any]:
        span = self._lines[-1].timestamp_ms / 1000.0
        mean_in = sum(x.input_length for x in self._lines) / len(self._lines)
        return {
            "workload": self.name, "trace": _display_path(self.path), "requests": len(self._lines), "trace_seconds": span,
            "mean_input_tokens": round(mean_in), "limit": self.limit, "duration": self.duration, "start": self.start,
        }  # fmt: skip

    def sessions(self) -> Iterator[SessionProto]:
        blocks = BlockTexts(self.texts)
        for line in self._lines:
            yield _TraceSession(blocks, line, self.max_model_len)


# -- the synthetic trace ---------------------------------------------------------------------


def synthesize(minutes: float, rate: float, seed: int) -> list[dict[str, Any]]:
    """A Mooncake-like trace: Zipf-popular shared prefixes (system prompts / documents),
    sessions that come back with a longer context, and unique tails."""
    rng = random.Random(seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    prefixes = [fresh(rng.randint(2, 10)) for _ in range(24)]
    weights = [1.0 / (k + 1) for k in range(len(prefixes))]
    sessions: list[list[int]] = []
    out: list[dict[str, Any]] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t > minutes * 60:
            return out
        if sessions and rng.random() < 0.35:
            base = rng.choice(sessions[-50:])  # a recent session comes back with more context
        elif rng.random() < 0.8:
            base = list(rng.choices(prefixes, weights)[0])
        else:
            base = []
        hash_ids = base + fresh(rng.randint(1, 8))
        if len(hash_ids) > 48:
            hash_ids = hash_ids[:48]
        sessions.append(hash_ids)
        input_length = (len(hash_ids) - 1) * TRACE_BLOCK + rng.randint(1, TRACE_BLOCK)
        output_length = int(min(800, max(8, rng.lognormvariate(4.6, 0.7))))
        out.append(
            {
                "timestamp": int(t * 1000),
                "input_length": input_length,
                "output_length": output_length,
                "hash_ids": hash_ids,
            }
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m continuum_bench.fleet.trace", description="write a synthetic Mooncake-format trace"
    )
    parser.add_argument("--out", default=str(DEFAULT_TRACE))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=1.5, help="requests per second")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    lines = synthesize(args.minutes, args.rate, args.seed)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as fh:
        for line in lines:
            fh.write(json.dumps(line, separators=(",", ":")) + "\n")
    print(f"wrote {len(lines)} requests to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
