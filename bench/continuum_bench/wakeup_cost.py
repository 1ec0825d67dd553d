"""What one wake-up of an idle process costs in CPU on this machine
(`python -m continuum_bench.wakeup_cost`).

The KV pipeline's processes (the listener, nats-server, the ingress's event consumer) do a
little work for each engine batch, and between batches they sleep. How much CPU a process is
charged for a wake-up depends on the machine: on a virtual machine the wake from idle itself
can cost more than the work. This measures it, as the scheduler charges it
(`/proc/self/schedstat`), at several paced rates, for three kinds of wake-up:

* `sleep`: a bare `time.sleep` loop (the floor: no event loop, no work);
* `uvloop`: an uvloop event loop woken by its timer, serializing a small JSON object each time;
* `jetstream`: a JetStream publish of 1,500 bytes with its acknowledgement awaited (nats-py,
  uvloop, a private `nats-server -js`), as the listener publishes a batch.

At high rates the process rarely goes idle and each wake-up costs what its work costs; at the
rates a small fleet emits batches (tens a second) each one also pays the wake from idle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable

import nats
import uvloop
from nats.js.api import StreamConfig

from continuum_common.procs import NatsServer

RATES = (20, 80, 400, 2000)


def _cpu_s() -> float:
    """This process's time on a CPU, as the scheduler accounts it."""
    with open("/proc/self/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def _sleep_us(rate: float, seconds: float) -> float:
    n = max(1, int(rate * seconds))
    started = _cpu_s()
    for _ in range(n):
        time.sleep(1 / rate)
    return (_cpu_s() - started) / n * 1e6


async def _paced_us(rate: float, seconds: float, work: Callable[[int], Awaitable[object]]) -> float:
    n = max(1, int(rate * seconds))
    started = _cpu_s()
    for i in range(n):
        await work(i)
        await asyncio.sleep(1 / rate)
    return (_cpu_s() - started) / n * 1e6


async def _measure(seconds: float) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {"sleep": {}, "uvloop": {}, "jetstream": {}}
    data = {"hashes": list(range(50)), "backend": "sim-0" * 20}

    async def dumps(_i: int) -> object:
        return json.dumps(data)

    for rate in RATES:
        out["sleep"][rate] = _sleep_us(rate, seconds)
        out["uvloop"][rate] = await _paced_us(rate, seconds, dumps)
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(tmp)
        await server.start()
        try:
            nc = await nats.connect(server.url)
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name="WAKEUP", subjects=["wakeup.>"]))
            payload = os.urandom(1500)
            for rate in RATES:

                async def publish(i: int, rate: int = rate) -> object:
                    return await js.publish("wakeup.x", payload, headers={"Nats-Msg-Id": f"{rate}-{i}"})

                out["jetstream"][rate] = await _paced_us(rate, seconds, publish)
            await nc.close()
        finally:
            await server.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0, help="per rate and kind")
    args = parser.parse_args(argv)
    results = uvloop.run(_measure(args.seconds))
    print("CPU per wake-up (µs), by rate:")
    print("| kind | " + " | ".join(f"{r}/s" for r in RATES) + " |")
    print("|---|" + "---:|" * len(RATES))
    for kind, by_rate in results.items():
        print(f"| {kind} | " + " | ".join(f"{by_rate[r]:.0f}" for r in RATES) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
