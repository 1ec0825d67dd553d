"""Pure pieces of bench/continuum_bench/peers: the peer routers' command lines and readiness checks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from continuum_bench.peers import smg as smg_peer
from continuum_bench.peers import vllm_router as vr
from continuum_sim import EngineEndpoints


def engine(i: int, **changes: object) -> EngineEndpoints:
    e = EngineEndpoints(
        name=f"sim-{i}", model="continuum-sim-8b", url=f"http://127.0.0.1:{8100 + i}",
        kv_events_endpoint=f"tcp://127.0.0.1:{5600 + 2 * i}", zmq_mode="bind",
        replay_endpoint=f"tcp://127.0.0.1:{5601 + 2 * i}", topic="", era="map", hash_wire="int",
        block_size=16, num_gpu_blocks=1500, python_hash_seed="0",
    )  # fmt: skip
    return replace(e, **changes)  # type: ignore[arg-type]


def values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def worker_urls(argv: list[str]) -> list[str]:
    start = argv.index("--worker-urls") + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    return argv[start:end]


FLEET = [engine(0), engine(1), engine(2)]


def test_vllm_router_kv_aware_subscribes_to_every_engine() -> None:
    argv = vr.vllm_router_argv(["vllm-router"], FLEET, policy="kv_aware", port=9000, prometheus_port=9001)
    assert values(argv, "--policy") == ["kv_aware"]
    assert values(argv, "--kv-event-source") == [
        "http://127.0.0.1:8100=tcp://127.0.0.1:5600",
        "http://127.0.0.1:8101=tcp://127.0.0.1:5602",
        "http://127.0.0.1:8102=tcp://127.0.0.1:5604",
    ]
    assert values(argv, "--kv-event-replay-source") == [
        "http://127.0.0.1:8100=tcp://127.0.0.1:5601",
        "http://127.0.0.1:8101=tcp://127.0.0.1:5603",
        "http://127.0.0.1:8102=tcp://127.0.0.1:5605",
    ]
    assert values(argv, "--kv-event-block-size") == ["16"]
    assert values(argv, "--kv-event-model") == ["continuum-sim-8b"]
    assert worker_urls(argv) == [e.url for e in FLEET]
    assert values(argv, "--port") == ["9000"] and values(argv, "--prometheus-port") == ["9001"]


def test_vllm_router_cache_aware_has_no_event_sources() -> None:
    argv = vr.vllm_router_argv(["/x/vllm-router"], FLEET, policy="cache_aware", port=9000, prometheus_port=9001)
    assert argv[0] == "/x/vllm-router"
    assert values(argv, "--policy") == ["cache_aware"]
    assert not [a for a in argv if a.startswith("--kv-event")]
    assert worker_urls(argv) == [e.url for e in FLEET]


def test_vllm_router_kv_aware_without_replay_endpoints() -> None:
    fleet = [engine(0, replay_endpoint=None), engine(1, replay_endpoint=None)]
    argv = vr.vllm_router_argv(["vllm-router"], fleet, policy="kv_aware", port=1, prometheus_port=2)
    assert len(values(argv, "--kv-event-source")) == 2
    assert values(argv, "--kv-event-replay-source") == []


@pytest.mark.parametrize(
    ("fleet", "message"),
    [
        ([engine(0), engine(1, block_size=32)], "block-size"),
        ([engine(0), engine(1, kv_events_endpoint=None)], "publishes no KV events"),
        ([engine(0, zmq_mode="connect")], "must bind"),
        ([engine(0, era="sglang")], "not vLLM's wire format"),
    ],
)
def test_vllm_router_kv_aware_refuses_fleets_it_cannot_read(fleet: list[EngineEndpoints], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        vr.vllm_router_argv(["vllm-router"], fleet, policy="kv_aware", port=1, prometheus_port=2)
    # cache_aware does not need the events
    vr.vllm_router_argv(["vllm-router"], fleet, policy="cache_aware", port=1, prometheus_port=2)


def test_smg_argv() -> None:
    argv = smg_peer.smg_argv(["smg"], FLEET, policy="cache_aware", port=9100, prometheus_port=9101)
    assert argv[:2] == ["smg", "launch"]
    assert values(argv, "--policy") == ["cache_aware"]
    assert values(argv, "--prometheus-host") == ["127.0.0.1"]
    assert worker_urls(argv) == [e.url for e in FLEET]
    with pytest.raises(ValueError):
        smg_peer.smg_argv(["smg"], [], policy="cache_aware", port=1, prometheus_port=2)


def test_vllm_router_readiness() -> None:
    expected = [e.url for e in FLEET]
    assert vr.workers_ready({"urls": [u + "/" for u in reversed(expected)]}, expected)
    assert not vr.workers_ready({"urls": expected[:2]}, expected)
    assert not vr.workers_ready({"urls": [*expected, "http://127.0.0.1:1"]}, expected)
    assert not vr.workers_ready({"error": "x"}, expected)
    assert not vr.workers_ready([], expected)


def test_smg_readiness() -> None:
    expected = [e.url for e in FLEET]

    def w(url: str, healthy: bool = True, status: str = "ready") -> dict[str, object]:
        return {"url": url, "is_healthy": healthy, "status": status}

    assert smg_peer.workers_ready({"workers": [w(u) for u in expected]}, expected)
    assert not smg_peer.workers_ready({"workers": []}, expected)  # smg listens before it registers
    assert not smg_peer.workers_ready({"workers": [w(u) for u in expected[:2]]}, expected)
    assert not smg_peer.workers_ready({"workers": [*[w(u) for u in expected[:2]], w(expected[2], False)]}, expected)
    assert not smg_peer.workers_ready(
        {"workers": [*[w(u) for u in expected[:2]], w(expected[2], status="pending")]}, expected
    )
    assert not smg_peer.workers_ready({"total": 3}, expected)
