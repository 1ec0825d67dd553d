"""Event → JetStream latency: from an engine's ZMQ send to delivery of the normalized event by a
JetStream consumer (so after the stream stored it).

    python -m continuum_bench.listener_latency                       # coalesce windows 50 ms and 0 ms
    python -m continuum_bench.listener_latency --events 5000 --rate 1000

The listener runs as its own process (`continuum-kv-listener`, salt echo) against a real
nats-server; this process plays the engine (a PUB socket) and the consumer (an ordered JetStream
push consumer). Each engine batch stores one new salted chain, so each produces exactly one
`created` event whose prefix key identifies the send time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nats
import yaml
import zmq
import zmq.asyncio
from nats.aio.msg import Msg

from continuum_common.events import EventType, decode_event
from continuum_common.procs import NatsServer, free_port
from continuum_common.salt import make_salt
from continuum_testing.engines import EnginePublisher, batch, stored

SECRET = b"bench-latency"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(window_ms: int, events: int, rate: float) -> list[float]:
    server = NatsServer()
    await server.start()
    workdir = Path(tempfile.mkdtemp(prefix="listener-latency-"))
    (workdir / "salt").write_text(SECRET.decode())
    zmq_port, http_port = free_port(), free_port()
    config = {
        "listen": f"127.0.0.1:{http_port}",
        "bus": {"embedded": False, "url": server.url},
        "salt": {"secret_file": str(workdir / "salt")},
        "limits": {"coalesce_window_ms": window_ms},
        "sources": [{"backend_name": "bench", "engine": "vllm", "zmq_endpoint": f"tcp://127.0.0.1:{zmq_port}",
                     "topic": "kv-events", "prefix_key_mode": "salt_echo", "publish": "prefix"}],
    }  # fmt: skip
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    ctx = zmq.asyncio.Context()
    engine = EnginePublisher(ctx, f"tcp://127.0.0.1:{zmq_port}")
    script = Path(sys.executable).parent / "continuum-kv-listener"
    proc = await asyncio.create_subprocess_exec(
        str(script), "--config", str(workdir / "config.yaml"), "--log-level", "WARNING"
    )
    sent: dict[str, float] = {}
    latencies: list[float] = []
    done = asyncio.Event()
    nc = await nats.connect(server.url)
    try:
        await engine.wait_subscribed()
        js = nc.jetstream()

        async def on_message(msg: Msg) -> None:
            now = time.perf_counter()
            event = decode_event(msg.data)
            if event.type is EventType.CREATED and event.prefix_hash in sent:
                latencies.append(now - sent.pop(event.prefix_hash))
                if len(latencies) >= events:
                    done.set()

        for _ in range(200):  # the listener creates the stream on start
            try:
                await js.stream_info("CONTINUUM_KV")
                break
            except Exception:
                await asyncio.sleep(0.05)
        await js.subscribe("continuum.kv.events.bench", cb=on_message, ordered_consumer=True)
        interval = 1.0 / rate
        next_at = time.perf_counter()
        for i in range(events):
            prefix = i.to_bytes(32, "big")
            payload = batch([stored([i + 1], None, [7] * 16, 16, salt=make_salt(SECRET, "bench", prefix))])
            sent[prefix.hex()] = time.perf_counter()
            await engine.send(payload)
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await nc.close()
        proc.terminate()
        await proc.wait()
        await engine.close()
        ctx.destroy(linger=0)
        await server.close()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=500.0, help="engine batches per second")
    parser.add_argument("--windows", default="50,0", help="coalesce windows to test, ms")
    args = parser.parse_args()
    logging.getLogger("nats").setLevel(logging.CRITICAL)  # readiness probes of the test server
    print(f"{args.events} events at {args.rate:.0f}/s, one new salted chain per engine batch")
    for window in (int(w) for w in args.windows.split(",")):
        lat = [x * 1000 for x in asyncio.run(measure(window, args.events, args.rate))]
        print(
            f"coalesce_window_ms={window:>3}: p50 {statistics.median(lat):6.2f} ms  p90 {percentile(lat, 0.9):6.2f} ms  "
            f"p99 {percentile(lat, 0.99):6.2f} ms  max {max(lat):6.2f} ms  (n={len(lat)})"
        )


if __name__ == "__main__":
    main()
