"""The listener's resident-block map per published batch (`python -m continuum_bench.listener_resident`).

Every block batch a source publishes goes through `ResidentBlocks.apply` (what a resync
restates; continuum_listener/policy/resident.py). Two steady states, µs per batch of
`--blocks` stored blocks:

* below capacity: the engine evicts as many blocks as it stores (one BlockRemoved per batch),
  the map stays at `--resident` blocks;
* at capacity: the engine holds more than `max_tracked_blocks`, so each batch also forgets
  the oldest `--blocks` entries of the map.

Median of `--repeats` runs of `--batches` batches each.
"""

from __future__ import annotations

import argparse
import statistics
import time

from continuum_common.wire.kv import BlockEvent, BlocksRemoved, BlocksStored
from continuum_listener.policy.resident import ResidentBlocks


def _run(resident: int, capacity: int, blocks: int, batches: int) -> float:
    """µs per batch once `resident` blocks are held."""
    res = ResidentBlocks(capacity)
    res.apply([BlocksStored(list(range(resident)), None, 16, 0)])
    oldest, newest = max(0, resident - capacity), resident
    started = time.perf_counter()
    for _ in range(batches):
        events: list[BlockEvent] = [BlocksStored(list(range(newest, newest + blocks)), newest - 1, 16, 0)]
        if resident < capacity:  # the engine evicted as many as it stored
            events.append(BlocksRemoved(list(range(oldest, oldest + blocks)), 0))
            oldest += blocks
        newest += blocks
        res.apply(events)
    return (time.perf_counter() - started) / batches * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", type=int, default=100_000, help="max_tracked_blocks")
    parser.add_argument("--resident", type=int, default=60_000, help="blocks held below capacity")
    parser.add_argument("--blocks", type=int, default=50, help="blocks stored per batch")
    parser.add_argument("--batches", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    cases = {
        f"below capacity ({args.resident:,} held)": args.resident,
        f"at capacity ({args.capacity:,} tracked, the engine holds more)": args.capacity,
    }
    for label, resident in cases.items():
        runs = [_run(resident, args.capacity, args.blocks, args.batches) for _ in range(args.repeats)]
        spread = ", ".join(f"{r:.1f}" for r in runs)
        print(f"{label}: {statistics.median(runs):.1f} µs per {args.blocks}-block batch (runs {spread})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
