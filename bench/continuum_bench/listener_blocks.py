"""Block mode end to end: engine ZMQ PUB → listener → JetStream, counted in the stream.

    python -m continuum_bench.listener_blocks                          # burst + hwm, 3 runs each
    python -m continuum_bench.listener_blocks --scenario burst --batches 4000 --repeats 3
    python -m continuum_bench.listener_blocks --scenario hwm
    python -m continuum_bench.listener_blocks --scenario sustained --rate 60000 --seconds 20

Four processes: a real `nats-server -js`; the listener (`continuum-kv-listener`, its own
process, `publish: blocks`); an engine process that frames pre-encoded vLLM-shaped batches
exactly like vLLM's ZmqEventPublisher (XPUB, [topic, u64be seq, payload], plus the replay
ROUTER) — one BlockStored of 20–200 new hashes per batch and, once its cache is full, as many
one-hash BlockRemoved events (continuum_bench.listener_workload.BlockTraffic); and this process, which
probes `/healthz` every 10 ms during the run (`--probe-ms`) and then reads the whole stream back.

* burst: the engine sends every batch as fast as it can. The rate is the block events found in
  the stream divided by the time between the first and the last data batch stored (JetStream
  message timestamps), so it is what the listener sustained end to end.
* hwm: the same burst against a listener whose SUB high-water mark is 100 batches and an engine
  PUB with a high-water mark of 100, so the PUB drops most of the burst while the listener is
  busy: everything must come back through replay (nothing lost, no new epoch).
* sustained: the engine paces batches at `--rate` block events/s for `--seconds`; reports the
  achieved rate and how far behind the stream was when the engine stopped.

Every scenario checks that the stream holds exactly the engine's block events and that the
listener counted no drops. A "block event" is one hash stored or removed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import statistics
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import nats
import yaml
import zmq
from nats.js.api import AckPolicy, ConsumerConfig

from continuum_bench.listener_workload import BlockTraffic
from continuum_common.procs import NatsServer, free_port
from continuum_common.wire.kv import AllCleared, decode_batch

BACKEND = "bench"
TARGET = 50_000
HEALTH_TARGET_MS = 50.0
END_SEQ = b"\xff" * 8


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the engine process ------------------------------------------------------------------------


def engine(args: argparse.Namespace) -> None:
    """Publish pre-encoded batches like vLLM's ZmqEventPublisher and answer replay requests."""
    traffic = BlockTraffic(seed=args.seed)
    payloads = list(traffic.batches(args.batches))
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, args.sndhwm)
    pub.bind(args.engine)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.SNDHWM, 0)
    router.bind(args.replay)
    buffer: deque[tuple[int, bytes]] = deque(maxlen=args.buffer_steps)
    print(f"ready {traffic.block_events}", flush=True)
    while pub.recv()[:1] != b"\x01":  # the listener's subscription
        pass
    interval = traffic.block_events / len(payloads) / args.rate if args.rate else 0.0
    next_at = time.perf_counter()
    for seq, payload in enumerate(payloads):
        frames = [b"kv-events", seq.to_bytes(8, "big"), payload]
        buffer.append((seq, payload))
        pub.send_multipart(frames)
        serve_replays(router, buffer, 0)
        if interval:
            next_at += interval
            while (wait := next_at - time.perf_counter()) > 0:
                serve_replays(router, buffer, int(wait * 1000) + 1)
    print(f"sent {time.time():.6f}", flush=True)
    deadline = time.monotonic() + args.linger
    while time.monotonic() < deadline:
        serve_replays(router, buffer, 100)
    ctx.destroy(linger=0)


def serve_replays(router: zmq.Socket[bytes], buffer: deque[tuple[int, bytes]], timeout_ms: int) -> None:
    while router.poll(timeout_ms):
        identity, _, start = router.recv_multipart()
        first = int.from_bytes(start, "big")
        for seq, payload in list(buffer):
            if seq >= first:
                router.send_multipart([identity, b"", b"kv-events", seq.to_bytes(8, "big"), payload])
        router.send_multipart([identity, b"", b"", END_SEQ, b""])
        timeout_ms = 0


# -- the driver -----------------------------------------------------------------------------------


@dataclass
class Run:
    block_events: int = 0  # in the stream (data batches)
    expected: int = 0
    seconds: float = 0.0
    health_ms: list[float] = field(default_factory=list)
    drops: float = 0.0
    replays: float = 0.0
    pauses: float = 0.0
    epochs: int = 0
    batches: int = 0
    listener_cpu: float = 0.0
    nats_cpu: float = 0.0
    lag_ms: float = 0.0

    @property
    def rate(self) -> float:
        return self.block_events / self.seconds if self.seconds else 0.0


def listener_config(workdir: Path, nats_url: str, zmq_port: int, replay_port: int, http_port: int, hwm: int) -> Path:
    config = {
        "listen": f"127.0.0.1:{http_port}",
        "bus": {"embedded": False, "url": nats_url},
        "sources": [{"backend_name": BACKEND, "engine": "vllm", "publish": "blocks", "block_size": 16,
                     "zmq_endpoint": f"tcp://127.0.0.1:{zmq_port}", "topic": "kv-events",
                     "replay_endpoint": f"tcp://127.0.0.1:{replay_port}", "zmq_rcvhwm": hwm}],
    }  # fmt: skip
    path = workdir / "listener.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def metric(text: str, name: str, match: str = "") -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and match in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def probe_health(client: httpx.AsyncClient, out: list[float], stop: asyncio.Event, every_s: float) -> None:
    if every_s <= 0:  # no probes: the listener's CPU is its own
        await stop.wait()
        return
    while not stop.is_set():
        started = time.perf_counter()
        response = await client.get("/healthz")
        response.raise_for_status()
        out.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(every_s)


async def stream_count(js: nats.js.JetStreamContext) -> int:
    try:
        return int((await js.stream_info("CONTINUUM_KV")).state.messages)
    except Exception:
        return 0


async def read_stream(js: nats.js.JetStreamContext, run: Run) -> tuple[float, float]:
    """Sum the stream's block events; returns the stored-time span of the data batches and the
    stored time of the last one."""
    sub = await js.pull_subscribe(
        "continuum.kv.events.>", durable=None, stream="CONTINUUM_KV", config=ConsumerConfig(ack_policy=AckPolicy.NONE)
    )
    first = last = None
    epochs: set[int] = set()
    total = await stream_count(js)
    seen = 0
    try:
        while seen < total:
            for msg in await sub.fetch(1000, timeout=5):
                seen += 1
                batch = decode_batch(msg.data)
                epochs.add(batch.source_epoch)
                run.batches += 1
                if batch.events and not all(isinstance(e, AllCleared) for e in batch.events):
                    stamp = msg.metadata.timestamp.timestamp()
                    first = stamp if first is None else first
                    last = stamp
                    run.block_events += batch.block_count
    finally:
        await sub.unsubscribe()
    run.epochs = len(epochs)
    return (last or 0.0) - (first or 0.0), last or 0.0


async def measure(args: argparse.Namespace, scenario: str) -> Run:
    run = Run()
    server = NatsServer()
    await server.start()
    workdir = Path(tempfile.mkdtemp(prefix="listener-blocks-"))
    zmq_port, replay_port, http_port = free_port(), free_port(), free_port()
    hwm = 100 if scenario == "hwm" else 100_000
    config = listener_config(workdir, server.url, zmq_port, replay_port, http_port, hwm)
    script = Path(sys.executable).parent / "continuum-kv-listener"
    listener = await asyncio.create_subprocess_exec(str(script), "--config", str(config), "--log-level", "WARNING")
    batches = args.batches
    if scenario == "sustained":
        batches = max(1, int(args.rate * args.seconds / 205))  # ~205 block events per batch
    engine_cmd = [
        sys.executable, "-m", "continuum_bench.listener_blocks", "--engine", f"tcp://127.0.0.1:{zmq_port}",
        "--replay", f"tcp://127.0.0.1:{replay_port}", "--batches", str(batches), "--seed", str(args.seed),
        "--sndhwm", str(100 if scenario == "hwm" else 100_000), "--linger", "60",
        "--rate", str(args.rate if scenario == "sustained" else 0),
    ]  # fmt: skip
    producer = await asyncio.create_subprocess_exec(*engine_cmd, stdout=asyncio.subprocess.PIPE)
    nc = await nats.connect(server.url)
    stop = asyncio.Event()
    try:
        assert producer.stdout is not None
        run.expected = int((await producer.stdout.readline()).split()[1])
        js = nc.jetstream()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=10) as client:
            for _ in range(400):  # the listener is up and has announced its epoch
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get("/healthz")).status_code == 200 and await stream_count(js) >= 1:
                        break
                await asyncio.sleep(0.05)
            cpu0, nats0 = cpu_seconds(listener.pid), cpu_seconds(server._proc.pid)  # type: ignore[union-attr]
            prober = asyncio.create_task(probe_health(client, run.health_ms, stop, args.probe_ms / 1000))
            sent_line = asyncio.create_task(producer.stdout.readline())
            settled, count = time.monotonic(), 0
            while time.monotonic() - settled < 2.0 or not sent_line.done():  # until the stream stops growing
                await asyncio.sleep(0.05)
                now = await stream_count(js)
                if now != count:
                    count, settled = now, time.monotonic()
            stop.set()
            await prober
            run.listener_cpu = cpu_seconds(listener.pid) - cpu0
            run.nats_cpu = cpu_seconds(server._proc.pid) - nats0  # type: ignore[union-attr]
            text = (await client.get("/metrics")).text
        sent_at = float((await sent_line).split()[1])
        run.drops = metric(text, "continuum_kv_event_dropped_total{")
        run.replays = metric(text, "continuum_kv_listener_replays_total{", 'outcome="recovered"')
        run.pauses = metric(text, "continuum_kv_listener_backpressure_pauses_total{")
        run.seconds, last_stored = await read_stream(js, run)
        run.lag_ms = (last_stored - sent_at) * 1000
    finally:
        stop.set()
        await nc.close()
        for proc in (producer, listener):
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
        await server.close()
    return run


def report(scenario: str, runs: list[Run]) -> None:
    for i, r in enumerate(runs, 1):
        h = r.health_ms or [0.0]
        lost = r.expected - r.block_events
        print(
            f"  run {i}: {r.rate:>9,.0f} block events/s ({r.block_events:,} of {r.expected:,} in the stream, "
            f"{r.batches:,} batches, {r.epochs} epoch(s)); /healthz p50 {statistics.median(h):.1f} "
            f"p99 {percentile(h, 0.99):.1f} max {max(h):.1f} ms (n={len(h)}, "
            f"{sum(1 for x in h if x > HEALTH_TARGET_MS)} over {HEALTH_TARGET_MS:.0f} ms); drops {r.drops:.0f}, "
            f"replays {r.replays:.0f}, pauses {r.pauses:.0f}; listener CPU {r.listener_cpu / max(r.block_events, 1) * 1e6:.1f} "
            f"µs/block event ({r.listener_cpu / max(r.batches, 1) * 1e6:.0f} µs/batch), nats-server "
            f"{r.nats_cpu / max(r.block_events, 1) * 1e6:.1f}; lag at end {r.lag_ms:.0f} ms"
            + ("" if lost == 0 else f"  LOST {lost}")
        )  # fmt: skip
    rate = statistics.median(r.rate for r in runs)
    probed = [r.health_ms or [0.0] for r in runs]
    health = [statistics.median(x) for x in zip(*[(percentile(h, 0.5), percentile(h, 0.99), max(h))
                                                  for h in probed], strict=True)]  # fmt: skip
    intact = all(r.block_events == r.expected and r.drops == 0 and r.epochs == 1 for r in runs)
    print(
        f"{scenario}: median {rate:,.0f} block events/s (target >= {TARGET:,}: {'met' if rate >= TARGET else 'MISSED'}); "
        f"/healthz medians p50 {health[0]:.1f} / p99 {health[1]:.1f} / max {health[2]:.1f} ms "
        f"(target <= {HEALTH_TARGET_MS:.0f} ms: {'met' if health[2] <= HEALTH_TARGET_MS else 'MISSED'}); "
        f"every block event in the stream, no drops, one epoch: {'yes' if intact else 'NO'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=["all", "burst", "hwm", "sustained"], default="all")
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=60_000, help="sustained: offered block events/s")
    parser.add_argument("--seconds", type=float, default=20.0, help="sustained: duration")
    parser.add_argument(
        "--probe-ms", type=float, default=10.0,
        help="interval of the /healthz probes during a run; 0: none (for the listener's CPU alone)",
    )  # fmt: skip
    # The engine process (internal).
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--replay", help=argparse.SUPPRESS)
    parser.add_argument("--sndhwm", type=int, default=100_000, help=argparse.SUPPRESS)
    parser.add_argument("--buffer-steps", type=int, default=10_000, help=argparse.SUPPRESS)
    parser.add_argument("--linger", type=float, default=60.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        engine(args)
        return
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    scenarios = ["burst", "hwm"] if args.scenario == "all" else [args.scenario]
    for scenario in scenarios:
        print(
            f"{scenario}: {args.batches if scenario != 'sustained' else 'paced'} vLLM-shaped batches, seed {args.seed}"
        )
        runs = [asyncio.run(measure(args, scenario)) for _ in range(args.repeats)]
        report(scenario, runs)


if __name__ == "__main__":
    main()
