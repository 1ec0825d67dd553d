"""Listener memory under 1,000,000 random engine events ("memory limits hold").

    python -m continuum_bench.listener_memory                          # 1M events, detokenize worst case
    python -m continuum_bench.listener_memory --mode salt_echo
    python -m continuum_bench.listener_memory --events 200000 --block-size 16

Worst case for the token limit: a detokenize source whose endpoint never answers, so every chain
stays unattributed and keeps its tokens (the detokenize queue fills and later jobs fail over to
"retry on the next block"). Blocks of 256 tokens make `max_tracked_blocks × block size` exceed
`max_retained_tokens`, so both limits prune. The seed's default limits are used unless given.
Prints the peak RSS of the process and checks the invariants after every 1,000 batches.
"""

from __future__ import annotations

import argparse
import resource
import time

from continuum_bench.listener_workload import Mix, Workload
from continuum_common.config.listener import ListenerSource
from continuum_common.events import KvEvent
from continuum_listener.attribution import Resolver
from continuum_listener.metrics import ListenerMetrics
from continuum_listener.pipeline import PipelineSettings, SourcePipeline
from continuum_listener.policy.chains import Limits

SECRET = b"bench-secret"


class Count:
    def __init__(self) -> None:
        self.events = 0

    def submit(self, _event: KvEvent) -> None:
        self.events += 1


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / (1 << 20)


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _never(_tokens: object) -> str:
    raise AssertionError("workers are not started in this benchmark")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--mode", choices=["detokenize", "salt_echo"], default="detokenize")
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--max-tracked-blocks", type=int, default=100_000)
    parser.add_argument("--max-retained-tokens", type=int, default=16_777_216)
    parser.add_argument("--max-chain-tokens", type=int, default=16_384)
    args = parser.parse_args()

    limits = Limits(args.max_chain_tokens, args.max_tracked_blocks, args.max_retained_tokens)
    source = ListenerSource(
        backend_name="bench", engine="vllm", zmq_endpoint="tcp://127.0.0.1:1", model="m", publish="prefix",
        prefix_key_mode=args.mode, detokenize_endpoint="http://127.0.0.1:1/detokenize",
    )  # fmt: skip
    resolver = None
    if args.mode == "detokenize":
        resolver = Resolver(detokenize=_never, family="chatml", model="m", max_prefix_length=1024)
    sink = Count()
    pipeline = SourcePipeline(
        source, PipelineSettings(limits, 0.05, 1024, SECRET), ListenerMetrics(["bench"]), [sink], resolver
    )
    pipeline.start_epoch("start")
    workload = Workload(SECRET, "bench", block_size=args.block_size, salted=args.mode == "salt_echo",
                        mix=Mix(new_request=0.15, extend=0.55), seed=7)  # fmt: skip
    baseline = rss_mib()
    per_batch = 10
    batches = args.events // per_batch
    bound = min(limits.max_retained_tokens, limits.max_tracked_blocks * limits.max_chain_tokens)
    max_blocks = max_tokens = 0
    started = time.perf_counter()
    for i, payload in enumerate(workload.batches(batches, per_batch)):
        pipeline.apply_payload(payload)
        if i % 1000 == 999:
            pipeline.flush()
            tracker = pipeline.tracker(0)
            assert len(tracker.blocks) <= limits.max_tracked_blocks
            assert tracker.retained_tokens <= bound
            max_blocks = max(max_blocks, len(tracker.blocks))
            max_tokens = max(max_tokens, tracker.retained_tokens)
    elapsed = time.perf_counter() - started
    pipeline.flush()
    tracker = pipeline.tracker(0)
    metric = pipeline.metrics.sample
    pruned_blocks = metric("continuum_kv_listener_chain_events_total", {"backend": "bench", "what": "pruned_blocks"})
    pruned_tokens = metric("continuum_kv_listener_chain_events_total", {"backend": "bench", "what": "pruned_tokens"})
    print(f"mode {args.mode}, block size {args.block_size}, limits: {limits}")
    print(f"{batches * per_batch:,} engine events ({workload.block_events:,} block events) in {elapsed:.1f}s")
    print(f"tracked blocks: max {max_blocks:,} (limit {limits.max_tracked_blocks:,}), now {len(tracker.blocks):,}")
    print(
        f"retained tokens: max {max_tokens:,} (bound {bound:,} = {bound * 4 / (1 << 20):.0f} MiB), now {tracker.retained_tokens:,}"
    )
    print(
        f"pruned: {pruned_blocks:,.0f} blocks, {pruned_tokens:,.0f} token segments; normalized events: {sink.events:,}"
    )
    print(f"RSS: baseline {baseline:.0f} MiB, now {rss_mib():.0f} MiB, peak {peak_mib():.0f} MiB")


if __name__ == "__main__":
    main()
