"""Listener throughput: block events decoded and tracked per second by one process.

    python -m continuum_bench.listener_throughput                   # in-process + through ZMQ, salt echo
    python -m continuum_bench.listener_throughput --batches 40000 --repeats 5

* in-process: pre-encoded payloads go straight into `SourcePipeline.apply_payload` (msgpack
  decode, chain tracking, salt verification, depth book), flushing coalesced events every 64
  batches (what a 50 ms window does at these rates);
* zmq: a separate publisher process sends the same payloads through a real PUB socket as fast as
  it can; the listener process runs the real ZmqSource; timed from the first to the last batch
  received (so publisher-side encoding is excluded).

A "block event" is one block hash stored or removed (a vLLM BlockStored event of a 16-block
prefill counts 16). Target: ≥ 50,000 block events/s in salt-echo mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time

import zmq
import zmq.asyncio

from continuum_bench.listener_workload import Workload
from continuum_common.config.listener import ListenerSource
from continuum_common.events import KvEvent
from continuum_common.procs import free_port
from continuum_listener.adapters.zmq_source import ZmqSource
from continuum_listener.metrics import ListenerMetrics
from continuum_listener.pipeline import PipelineSettings, SourcePipeline
from continuum_listener.policy.chains import Limits

SECRET = b"bench-secret"
BACKEND = "bench"
TARGET = 50_000


class Count:
    def __init__(self) -> None:
        self.events = 0

    def submit(self, _event: KvEvent) -> None:
        self.events += 1


def make_payloads(batches: int, seed: int) -> tuple[list[bytes], int]:
    workload = Workload(SECRET, BACKEND, seed=seed)
    payloads = list(workload.batches(batches))
    return payloads, workload.block_events


def pipeline(endpoint: str = "tcp://127.0.0.1:1", window: float = 0.05) -> tuple[SourcePipeline, Count]:
    source = ListenerSource(
        backend_name=BACKEND,
        engine="vllm",
        zmq_endpoint=endpoint,
        prefix_key_mode="salt_echo",
        topic="",
        publish="prefix",
    )
    sink = Count()
    return SourcePipeline(
        source, PipelineSettings(Limits(), window, 1024, SECRET), ListenerMetrics([BACKEND]), [sink]
    ), sink


def run_inprocess(payloads: list[bytes], block_events: int) -> tuple[float, int, int]:
    pipe, sink = pipeline()
    pipe.start_epoch("start")
    start = time.perf_counter()
    for i, payload in enumerate(payloads):
        pipe.apply_payload(payload)
        if i % 64 == 63:
            pipe.flush()
    pipe.flush()
    elapsed = time.perf_counter() - start
    assert pipe.stats.dropped == 0
    return block_events / elapsed, sink.events, len(pipe.tracker(0).blocks)


async def run_zmq(batches: int, seed: int, block_events: int) -> tuple[float, int]:
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    pipe, _sink = pipeline(endpoint)
    pipe.start_epoch("start")
    ctx = zmq.asyncio.Context()
    source = ZmqSource(ctx, pipe.source, pipe)
    received: list[float] = []
    done = asyncio.Event()
    original = pipe.apply_payload

    def timed(payload: bytes) -> None:
        received.append(time.perf_counter())
        original(payload)
        if len(received) >= batches:
            done.set()

    pipe.apply_payload = timed  # type: ignore[method-assign]
    tasks = [asyncio.create_task(source.run()), asyncio.create_task(pipe.run())]
    publisher = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "continuum_bench.listener_throughput", "--publish", endpoint, "--batches", str(batches),
        "--seed", str(seed),
    )  # fmt: skip
    try:
        waiter = asyncio.create_task(done.wait())
        await asyncio.wait({waiter, asyncio.create_task(publisher.wait())}, return_when=asyncio.FIRST_COMPLETED)
        # The publisher exited: the listener may still be working through its SUB queue; wait
        # while it makes progress (a batch lost in transit never arrives).
        seen = -1
        while not done.is_set() and len(received) != seen:
            seen = len(received)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(waiter), 2.0)
        waiter.cancel()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await publisher.wait()
        ctx.destroy(linger=0)
    lost = batches - len(received)
    elapsed = received[-1] - received[0]
    return block_events * (len(received) - 1) / batches / elapsed, lost


def publish(endpoint: str, batches: int, seed: int) -> None:
    payloads, _ = make_payloads(batches, seed)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(endpoint)
    while pub.recv()[:1] != b"\x01":  # wait for the listener's subscription
        pass
    for seq, payload in enumerate(payloads):
        pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
    time.sleep(0.5)
    pub.close(linger=5000)
    ctx.term()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--publish", help=argparse.SUPPRESS)
    parser.add_argument("--skip-zmq", action="store_true")
    args = parser.parse_args()
    if args.publish:
        publish(args.publish, args.batches, args.seed)
        return
    payloads, block_events = make_payloads(args.batches, args.seed)
    size = sum(len(p) for p in payloads)
    print(f"workload: {args.batches} batches, {block_events} block events, {size / 1e6:.1f} MB msgpack")
    rates = []
    for _ in range(args.repeats):
        rate, events, tracked = run_inprocess(payloads, block_events)
        rates.append(rate)
    print(f"in-process  median {statistics.median(rates):>10,.0f} block events/s  (runs: "
          f"{', '.join(f'{r:,.0f}' for r in rates)}; {events} normalized events, {tracked} blocks tracked)")  # fmt: skip
    if not args.skip_zmq:
        zrates, losses = [], []
        for _ in range(args.repeats):
            rate, lost = asyncio.run(run_zmq(args.batches, args.seed, block_events))
            zrates.append(rate)
            losses.append(lost)
        print(f"through ZMQ median {statistics.median(zrates):>10,.0f} block events/s  (runs: "
              f"{', '.join(f'{r:,.0f}' for r in zrates)}; batches lost: {losses})")  # fmt: skip
    verdict = "met" if statistics.median(rates) >= TARGET else "MISSED"
    print(f"target >= {TARGET:,} block events/s (salt echo): {verdict}")


if __name__ == "__main__":
    main()
