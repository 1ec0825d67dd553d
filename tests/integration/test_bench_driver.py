"""The benchmark's load driver keeps its own CPU work off its event loop: requests are prepared
on a worker thread before they are due and sent at their time, the ideal cache is fed on the
same thread in the order of the sends, and preparation that runs past a request's time is
counted. Real simulated engines over HTTP."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from continuum_bench.fleet.driver import Driver
from continuum_bench.fleet.ideal import IdealCache
from continuum_bench.fleet.tokens import Texts, make_codec
from continuum_bench.fleet.workloads import BenchRequest
from continuum_sim import SimFleet

BLOCK = 16


@dataclass
class _SlowSession:
    """One completion request whose preparation takes `prepare_s` seconds of a blocking call."""

    start: float
    request: BenchRequest
    prepare_s: float
    threads: list[int]
    done: bool = field(default=False)

    def next_request(self, previous_answer: str | None) -> BenchRequest | None:
        if self.done:
            return None
        self.done = True
        self.threads.append(threading.get_ident())
        time.sleep(self.prepare_s)
        return self.request

    def think_time(self) -> float:
        return 0.0


@dataclass
class _Workload:
    items: list[_SlowSession]
    name: str = "slow"

    def sessions(self) -> Iterator[_SlowSession]:
        return iter(self.items)

    def describe(self) -> dict[str, Any]:
        return {"workload": self.name}

    @property
    def total_requests(self) -> int:
        return len(self.items)


def _requests(count: int) -> list[BenchRequest]:
    codec = make_codec("builtin")
    texts = Texts(codec)
    shared = texts.text(20 * BLOCK, random.Random("shared"))
    out = []
    for i in range(count):
        text = shared + texts.text(40, random.Random(f"tail-{i}"), leading_space=True)
        out.append(BenchRequest("completions", {"prompt": text, "max_tokens": 4}, codec.encode(text), 4))
    return out


async def test_requests_are_prepared_off_the_loop_and_sent_on_time() -> None:
    threads: list[int] = []
    requests = _requests(3)
    starts = [0.6, 1.2, 1.8]
    sessions = [_SlowSession(s, r, 0.2, threads) for s, r in zip(starts, requests, strict=True)]
    ideal = IdealCache(None, BLOCK)
    async with SimFleet(2, time_scale=0.01) as fleet:
        driver = Driver(
            [e.openai_base_url for e in fleet.endpoints], mode="direct", model=fleet.endpoints[0].model,
            time_scale=1.0, ideals=[ideal], codec=make_codec("builtin"),
        )  # fmt: skip
        results = await driver.run(_Workload(sessions))
    assert len(threads) == 3 and threading.get_ident() not in threads, "prepared on the worker thread"
    assert all(r.ok for r in results), [r.error for r in results]
    assert driver.late_sends == 0
    sent = sorted(r.sent_at for r in results)
    assert all(at >= start - 0.01 for at, start in zip(sent, starts, strict=True)), "none sent before its time"
    # The ideal cache saw the sends in order: the same hits as a replay of the prompts.
    replay = IdealCache(None, BLOCK)
    expected = [replay.on_send(r.prompt_ids) for r in requests]
    by_send = [r.ideal_hit_tokens for r in sorted(results, key=lambda r: r.sent_at)]
    assert by_send == expected and expected[0] == 0 and expected[1] >= 19 * BLOCK
    assert ideal.hit_tokens == sum(expected)


async def test_preparation_past_a_requests_time_is_counted() -> None:
    threads: list[int] = []
    requests = _requests(2)
    sessions = [_SlowSession(0.0, r, 0.15, threads) for r in requests]
    async with SimFleet(1, time_scale=0.01) as fleet:
        driver = Driver(
            [fleet.endpoints[0].openai_base_url], mode="direct", model=fleet.endpoints[0].model, time_scale=1.0,
            ideals=[IdealCache(None, BLOCK)], codec=make_codec("builtin"), prepare_ahead=0.0,
        )  # fmt: skip
        results = await driver.run(_Workload(sessions))
    assert all(r.ok for r in results)
    assert driver.late_sends == 2, "each request waited for its preparation, the second behind the first"
    first, second = sorted(r.sent_at for r in results)
    assert second - first >= 0.14, "one worker prepares one request at a time"
