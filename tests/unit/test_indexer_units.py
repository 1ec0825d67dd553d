"""Pure parts of the indexer service: backoff, bus message decoding, settings, admin bodies."""

from __future__ import annotations

import pytest

from continuum_common.backoff import Backoff
from continuum_common.config.loader import parse
from continuum_common.config.router import RouterConfig
from continuum_common.events import EventType, KvEvent
from continuum_common.kvindex import BackendCounters, ClearReport, IndexStats
from continuum_common.wire import indexer_admin as admin
from continuum_common.wire.indexer_admin import SourceStats
from continuum_indexer.config import IndexerSettings, parse_listen
from continuum_indexer.errors import DroppedEvent
from continuum_indexer.protocol.bus_messages import decode_bus_message


def test_backoff_doubles_to_the_cap_and_resets() -> None:
    b = Backoff.for_sse_source(5000)
    assert [b.next() for _ in range(6)] == [5, 10, 20, 40, 60, 60]
    b.reset()
    assert b.next() == 5
    slow = Backoff.for_sse_source(120_000)  # max(reconnect_interval, 60 s)
    assert [slow.next(), slow.next()] == [120, 120]
    with pytest.raises(ValueError):
        Backoff(0, 1)


def test_bus_messages() -> None:
    event = KvEvent("a", 1, 2, 3.0, EventType.CREATED, "f" * 64, 5)
    assert decode_bus_message("continuum.kv.events.a", event.encode()) == event
    with pytest.raises(DroppedEvent) as err:
        decode_bus_message("continuum.kv.events.b", event.encode())
    assert (err.value.reason, err.value.backend) == ("backend_mismatch", "b")
    with pytest.raises(DroppedEvent) as err:
        decode_bus_message("continuum.kv.events.a", b"\x00garbage")
    assert err.value.reason == "decode"


def test_listen_and_source_selection() -> None:
    assert parse_listen("0.0.0.0:9102") == ("0.0.0.0", 9102)
    assert parse_listen(":80") == ("127.0.0.1", 80)
    assert parse_listen("off") is None
    with pytest.raises(ValueError):
        parse_listen("nope")
    cfg = parse(
        RouterConfig,
        {
            "backends": [{"name": "x", "url": "http://h:1"}],
            "kv_cache_index": {
                "enabled": True,
                "event_sources": [
                    {"backend_name": "s", "endpoint": "http://l:7817/events/s"},
                    {"backend_name": "b", "transport": "event_bus"},
                ],
            },
        },
    )
    settings = IndexerSettings(config=cfg)
    assert settings.sse_backends == {"s"} and settings.known_backends() == {"x", "s", "b"}


def test_admin_bodies_have_the_seed_shapes() -> None:
    cfg = parse(RouterConfig, {"kv_cache_index": {"enabled": True}}).kv_cache_index
    src = SourceStats("event_bus", "event_bus", connected=True, events_received=3, last_event_at=0.0)
    body = admin.stats_body(cfg, IndexStats(2, 3, 1, "memory"), [src], None, "r1")
    assert body["index"] == {"prefix_count": 2, "entry_count": 3, "total_evictions": 1}
    assert body["event_sources"][0]["last_event_at"] == "1970-01-01T00:00:00Z"
    rows = admin.backends_body(cfg, {"a": BackendCounters(received=4, index_created=2)}, [src])["backends"]
    assert rows == [
        {
            "backend_name": "a",
            "connection": None,
            "events": {
                "received": 4,
                "dropped": 0,
                "applied": 0,
                "stale": 0,
                "index_created": 2,
                "index_evicted": 0,
                "clears": 0,
            },
        }
    ]
    assert admin.clear_body(ClearReport(618, 2)) == {"success": True, "entries_before_clear": 618, "cleared_entries": 2}
