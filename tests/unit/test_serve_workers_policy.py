"""The pure parts of `serve` with several workers: restart decisions and backoff, which
transports the load view uses, the load_sharing section (new place and old), and the merge of
several processes' metrics into one exposition."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from continuum_common.config import RouterConfig
from continuum_common.config.kv_index import LoadSharing
from continuum_common.config.loader import parse
from continuum_common.errors import ConfigError
from continuum_common.exposition import Families
from continuum_ingress.adapters.worker_metrics import _parse
from continuum_ingress.config_holder import restart_only_changes
from continuum_ingress.policy.restarts import ExitVerdict, RestartBackoff, after_exit
from continuum_ingress.policy.shared_load import choose_transports
from continuum_ingress.protocol.exposition import ExpositionError, merge
from continuum_ingress.protocol.exposition import parse as parse_text
from continuum_ingress.workers import WorkerSeat
from continuum_testing.loop_turns import turns_during

# ---- restarts -----------------------------------------------------------------------------


def test_exit_verdicts() -> None:
    assert after_exit(stopping=True, serving=True) is ExitVerdict.DONE
    assert after_exit(stopping=True, serving=False) is ExitVerdict.DONE
    assert after_exit(stopping=False, serving=False) is ExitVerdict.FAIL
    assert after_exit(stopping=False, serving=True) is ExitVerdict.RESTART


def test_backoff_doubles_on_quick_deaths_caps_and_resets_after_a_stable_run() -> None:
    backoff = RestartBackoff(initial_s=0.2, max_s=3.0, stable_after_s=30.0)
    assert [backoff.next_delay(1.0) for _ in range(6)] == [0.2, 0.4, 0.8, 1.6, 3.0, 3.0]
    assert backoff.next_delay(30.0) == 0.2  # it ran long enough: a fresh start
    assert backoff.next_delay(0.5) == 0.4


def test_backoff_never_overflows() -> None:
    backoff = RestartBackoff(initial_s=0.2, max_s=30.0)
    delays = [backoff.next_delay(0.0) for _ in range(2000)]
    assert delays[-1] == 30.0


# ---- worker seats --------------------------------------------------------------------------


def test_a_seat_names_its_sockets_and_siblings() -> None:
    seat = WorkerSeat(Path("/run/x"), 1, 3)
    assert seat.others() == [0, 2]
    assert seat.load_socket(2) == Path("/run/x/load-2.sock")
    assert seat.metrics_socket("supervisor") == Path("/run/x/metrics-supervisor.sock")
    assert seat.argv() == ["--worker-dir", "/run/x", "--worker-index", "1", "--worker-count", "3"]
    with pytest.raises(ValueError):
        WorkerSeat(Path("/run/x"), 3, 3)


# ---- transports ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "workers", "kv", "local", "bus"),
    [
        ({}, 1, False, False, False),  # one process, no KV routing: no peers
        ({}, 2, False, True, False),
        ({}, 1, True, False, True),  # KV routing on: replicas share over its NATS connection
        ({}, 4, True, True, True),
        ({"bus": "always"}, 1, False, False, True),
        ({"bus": "never"}, 2, True, True, False),
        ({"enabled": False}, 4, True, False, False),
    ],
)
def test_choose_transports(settings: dict, workers: int, kv: bool, local: bool, bus: bool) -> None:
    chosen = choose_transports(LoadSharing(**settings), workers=workers, kv_routing=kv)
    assert (chosen.local, chosen.bus) == (local, bus)
    assert chosen.any == (local or bus)


# ---- the load_sharing section --------------------------------------------------------------


def test_load_sharing_lives_at_the_top_and_the_old_place_still_counts() -> None:
    assert RouterConfig().shared_load() == LoadSharing()
    top = parse(RouterConfig, {"load_sharing": {"interval_ms": 20, "stale_after_ms": 500, "bus": "always"}})
    assert (top.shared_load().interval_ms, top.shared_load().bus) == (20, "always")
    old = parse(RouterConfig, {"kv_cache_index": {"load_sharing": {"enabled": False}}})
    assert old.shared_load().enabled is False


def test_load_sharing_in_both_places_is_an_error_with_paths() -> None:
    with pytest.raises(ConfigError) as info:
        parse(RouterConfig, {"load_sharing": {}, "kv_cache_index": {"load_sharing": {}}})
    assert any(p.startswith("load_sharing") and "kv_cache_index.load_sharing" in p for p in info.value.problems)
    with pytest.raises(ConfigError) as info:
        parse(RouterConfig, {"kv_cache_index": {"load_sharing": {"interval_ms": 100, "stale_after_ms": 100}}})
    assert any(p.startswith("kv_cache_index.load_sharing.stale_after_ms") for p in info.value.problems)
    with pytest.raises(ConfigError) as info:
        parse(RouterConfig, {"load_sharing": {"bus": "sometimes"}})
    assert any(p.startswith("load_sharing.bus") for p in info.value.problems)


def test_load_sharing_and_workers_need_a_restart() -> None:
    old = RouterConfig()
    new = parse(RouterConfig, {"load_sharing": {"enabled": False}, "server": {"workers": 4}})
    assert set(restart_only_changes(old, new)) == {"load_sharing", "server.workers"}


# ---- metrics merge -------------------------------------------------------------------------


def _worker_registry(requests: float, running: float) -> bytes:
    registry = CollectorRegistry()
    Counter("demo_requests", "Requests", ["endpoint"], registry=registry).labels("chat").inc(requests)
    Gauge("demo_in_flight", "In flight", registry=registry).set(running)
    Histogram("demo_seconds", "Latency", buckets=(0.1, 1.0), registry=registry).observe(0.5)
    return generate_latest(registry)


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_merge_labels_every_sample_with_its_worker_and_keeps_one_family_per_name() -> None:
    supervisor = CollectorRegistry()
    Counter("demo_worker_restarts", "Restarts", ["worker"], registry=supervisor).labels("1").inc(2)
    sources = [
        ("0", parse_text(_worker_registry(3, 1))),
        ("1", parse_text(_worker_registry(5, 2))),
        (None, parse_text(generate_latest(supervisor))),
    ]
    merged = generate_latest(Families(merge(sources)))
    text = merged.decode()
    assert text.count("# TYPE demo_requests_total counter") == 1
    assert text.count("# TYPE demo_seconds histogram") == 1
    samples = _samples(merged)
    assert samples[("demo_requests_total", (("endpoint", "chat"), ("worker", "0")))] == 3
    assert samples[("demo_requests_total", (("endpoint", "chat"), ("worker", "1")))] == 5
    assert samples[("demo_in_flight", (("worker", "1"),))] == 2
    assert samples[("demo_seconds_bucket", (("le", "1.0"), ("worker", "0")))] == 1
    # A sample that names its worker already keeps it; the supervisor's get no label of their own.
    assert samples[("demo_worker_restarts_total", (("worker", "1"),))] == 2


def test_merge_leaves_out_a_family_whose_type_disagrees() -> None:
    one, two = CollectorRegistry(), CollectorRegistry()
    Gauge("demo_thing", "A gauge", registry=one).set(1)
    Counter("demo_thing", "A counter", registry=two).inc()
    merged = merge([("0", parse_text(generate_latest(one))), ("1", parse_text(generate_latest(two)))])
    thing = [f for f in merged if f.name == "demo_thing"]
    assert len(thing) == 1 and thing[0].type == "gauge"
    assert [s.labels for s in thing[0].samples] == [{"worker": "0"}]


def test_an_unreadable_exposition_is_an_error() -> None:
    with pytest.raises(ExpositionError):
        parse_text(b'demo_requests_total{endpoint="chat" 1\n')
    with pytest.raises(ExpositionError):
        parse_text(b"\xff\xfe")


async def test_a_siblings_exposition_is_parsed_with_a_loop_turn_after_each_family() -> None:
    text = _worker_registry(3, 1)  # 3 families
    parsed, counted = await turns_during(_parse(text))
    assert [f.name for f in parsed] == [f.name for f in parse_text(text)]
    assert counted >= 3
    with pytest.raises(ExpositionError):  # raised while iterating, as `parse` raises it
        await _parse(b"demo_ok 1\n" + b'demo_requests_total{endpoint="chat" 1\n')
