"""Structural statistics of a Mooncake-format trace, or of the `conversations` workload:

    python -m continuum_bench.fleet.describe TRACE.jsonl [TRACE2.jsonl ...] [--conversations] [--duration S]

Everything is computed from the trace lines alone (timestamps, lengths, 512-token block ids),
so a generated workload and a real trace are measured the same way:

* **first block shared**: share of requests whose first block appears in another request;
* **shared root**: per request, the blocks before its path leaves the popular part of the
  prefix tree (a node with `FANOUT` or more distinct next blocks, e.g. the end of a system
  prompt that many conversations follow); mean, in blocks;
* **reusable prefix**: the longest leading run of blocks already seen in an earlier request,
  as a share of all input tokens (what an unbounded prefix cache could hit, at block grain);
* **follow-ups**: a request that extends an earlier request (shares all of that request's full
  blocks and goes beyond the shared root) is that conversation's next turn. From them: turns
  per conversation, growth per turn (input tokens added), time between turns, and the reuse
  distance (requests, and input tokens of other requests, sent in between; compare the latter
  with the fleet's KV capacity);
* input and output length distributions.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from continuum_bench.fleet.trace import TRACE_BLOCK, TraceLine, load_trace

FANOUT = 16


def _quantiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    arr = np.asarray(values, dtype=float)
    qs = np.percentile(arr, [10, 25, 50, 75, 90, 99])
    return {"mean": float(arr.mean()), **{f"p{p}": float(q) for p, q in zip((10, 25, 50, 75, 90, 99), qs, strict=True)}}


def _chains(lines: Sequence[TraceLine]) -> list[list[int]]:
    """Per request, a key per leading-block prefix (equal keys = equal prefixes)."""
    out = []
    for line in lines:
        keys, parent = [], 0
        for block in line.hash_ids:
            parent = hash((parent, block))
            keys.append(parent)
        out.append(keys)
    return out


def _shared_roots(lines: Sequence[TraceLine], chains: Sequence[list[int]]) -> list[int]:
    children: dict[int, set[int]] = {}
    for line, keys in zip(lines, chains, strict=True):
        for i in range(len(keys) - 1):
            kids = children.setdefault(keys[i], set())
            if len(kids) < FANOUT:
                kids.add(line.hash_ids[i + 1])
    roots = []
    for keys in chains:
        root = 0
        for i, key in enumerate(keys):
            if len(children.get(key, ())) >= FANOUT:
                root = i + 1
        roots.append(root)
    return roots


def trace_stats(lines: Sequence[TraceLine]) -> dict[str, Any]:
    if not lines:
        raise ValueError("no requests to describe")
    chains = _chains(lines)
    roots = _shared_roots(lines, chains)
    first_counts: dict[int, int] = {}
    for line in lines:
        first_counts[line.hash_ids[0]] = first_counts.get(line.hash_ids[0], 0) + 1
    seen: set[int] = set()
    ends: dict[int, int] = {}  # key of a request's full-block prefix -> latest request index
    reused = 0
    growth, gaps, distance_requests, distance_tokens = [], [], [], []
    prefix_tokens = np.cumsum([0] + [x.input_length for x in lines])
    for i, (line, keys) in enumerate(zip(lines, chains, strict=True)):
        depth = 0
        while depth < len(keys) and keys[depth] in seen:
            depth += 1
        reused += min(depth * TRACE_BLOCK, line.input_length)
        parent = None
        for k in range(depth, roots[i], -1):  # the deepest earlier request this one extends
            parent = ends.get(keys[k - 1])
            if parent is not None:
                break
        if parent is not None:
            p = lines[parent]
            growth.append(line.input_length - p.input_length)
            gaps.append((line.timestamp_ms - p.timestamp_ms) / 1000)
            distance_requests.append(i - parent)
            distance_tokens.append(int(prefix_tokens[i] - prefix_tokens[parent + 1]))
        seen.update(keys)
        full = line.input_length // TRACE_BLOCK
        if full:
            ends[keys[min(full, len(keys)) - 1]] = i
    follow_ups = len(growth)
    span = (lines[-1].timestamp_ms - lines[0].timestamp_ms) / 1000
    total_input = sum(x.input_length for x in lines)
    return {
        "requests": len(lines),
        "span_s": span,
        "requests_per_s": len(lines) / span if span > 0 else None,
        "first_block_shared": sum(1 for x in lines if first_counts[x.hash_ids[0]] > 1) / len(lines),
        "shared_root_blocks": float(np.mean(roots)),
        "reusable_prefix": reused / total_input if total_input else 0.0,
        "follow_up_share": follow_ups / len(lines),
        "turns_per_conversation": len(lines) / (len(lines) - follow_ups) if follow_ups < len(lines) else None,
        "input_tokens": _quantiles([x.input_length for x in lines]),
        "output_tokens": _quantiles([x.output_length for x in lines]),
        "growth_per_turn_tokens": _quantiles(growth),
        "time_between_turns_s": _quantiles(gaps),
        "reuse_distance_requests": _quantiles(distance_requests),
        "reuse_distance_tokens": _quantiles(distance_tokens),
    }


ROWS: tuple[tuple[str, str, str], ...] = (
    ("requests", "requests", "{:.0f}"),
    ("span_s", "span (s)", "{:.0f}"),
    ("requests_per_s", "requests/s", "{:.2f}"),
    ("first_block_shared", "first block shared", "{:.1%}"),
    ("shared_root_blocks", "shared root (blocks, mean)", "{:.2f}"),
    ("reusable_prefix", "reusable prefix (share of input tokens)", "{:.1%}"),
    ("follow_up_share", "follow-up turns (share of requests)", "{:.1%}"),
    ("turns_per_conversation", "turns per conversation (mean)", "{:.2f}"),
    ("input_tokens.mean", "input tokens mean", "{:,.0f}"),
    ("input_tokens.p10", "input tokens p10", "{:,.0f}"),
    ("input_tokens.p50", "input tokens p50", "{:,.0f}"),
    ("input_tokens.p90", "input tokens p90", "{:,.0f}"),
    ("input_tokens.p99", "input tokens p99", "{:,.0f}"),
    ("output_tokens.mean", "output tokens mean", "{:,.0f}"),
    ("output_tokens.p50", "output tokens p50", "{:,.0f}"),
    ("growth_per_turn_tokens.mean", "growth per turn mean (tokens)", "{:,.0f}"),
    ("growth_per_turn_tokens.p50", "growth per turn p50", "{:,.0f}"),
    ("growth_per_turn_tokens.p90", "growth per turn p90", "{:,.0f}"),
    ("time_between_turns_s.p50", "time between turns p50 (s)", "{:,.0f}"),
    ("time_between_turns_s.p90", "time between turns p90 (s)", "{:,.0f}"),
    ("reuse_distance_requests.p50", "reuse distance p50 (requests)", "{:,.0f}"),
    ("reuse_distance_tokens.p50", "reuse distance p50 (tokens)", "{:,.0f}"),
    ("reuse_distance_tokens.p90", "reuse distance p90 (tokens)", "{:,.0f}"),
)


def _get(stats: dict[str, Any], dotted: str) -> Any:
    value: Any = stats
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def markdown_table(columns: Sequence[tuple[str, dict[str, Any]]]) -> str:
    head = "| statistic | " + " | ".join(name for name, _ in columns) + " |\n"
    head += "|---|" + "---:|" * len(columns) + "\n"
    rows = []
    for key, label, fmt in ROWS:
        cells = []
        for _, stats in columns:
            value = _get(stats, key)
            cells.append("-" if value is None else fmt.format(value))
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return head + "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    from continuum_bench.fleet.conversations import ConversationShape, mooncake_lines, plan_conversations

    parser = argparse.ArgumentParser(prog="python -m continuum_bench.fleet.describe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("traces", nargs="*", help="Mooncake JSONL files")
    parser.add_argument("--conversations", action="store_true", help="also describe the conversations workload")
    parser.add_argument("--duration", type=float, help="only the first SECONDS (default: all; conversations 3600)")
    parser.add_argument("--seed", type=int, default=1, help="the conversations workload's seed")
    parser.add_argument("--max-context", type=int, default=131_072, help="the conversations workload's context cap")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    args = parser.parse_args(argv)
    if not args.traces and not args.conversations:
        parser.error("name a trace file or pass --conversations")
    columns: list[tuple[str, dict[str, Any]]] = []
    try:
        for path in args.traces:
            columns.append((Path(path).name, trace_stats(load_trace(path, duration_s=args.duration))))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}")
        return 1
    if args.conversations:
        shape = ConversationShape()
        duration = args.duration or 3600.0
        plans = plan_conversations(shape, duration=duration, seed=args.seed, max_context=args.max_context)
        columns.append((f"conversations (seed {args.seed})", trace_stats(mooncake_lines(plans, shape, args.seed))))
    print(json.dumps(dict(columns), indent=2) if args.json else markdown_table(columns), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
