"""Response ids off the wire, the owner memory, and the routing decision of response affinity
(pure parts; the HTTP path is in tests/integration/test_response_affinity_sim.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from continuum_common.config import Backend, RouterConfig
from continuum_ingress.policy.response_owners import ResponseOwners
from continuum_ingress.pool import BackendState
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.requests import parse_request
from continuum_ingress.protocol.response_ids import (
    id_in_body,
    id_in_stream_head,
    not_found_here,
    previous_response_id,
)
from continuum_ingress.response_affinity import ResponseAffinity
from continuum_ingress.state import RequestState
from continuum_ingress.stored_responses import is_event_stream, relay_stream
from continuum_ingress.transport import UpstreamError


def test_owners_remember_and_forget_the_least_recently_used_first() -> None:
    owners = ResponseOwners(max_entries=2, ttl_s=100.0)
    owners.remember("a", "sim-0", 0.0)
    owners.remember("b", "sim-1", 1.0)
    assert owners.owner("a", 2.0) == "sim-0"  # a is now the most recently used
    owners.remember("c", "sim-2", 3.0)
    assert owners.owner("b", 4.0) is None
    assert (owners.owner("a", 4.0), owners.owner("c", 4.0), len(owners)) == ("sim-0", "sim-2", 2)


def test_owners_expire_after_the_ttl_and_shrink_on_resize() -> None:
    owners = ResponseOwners(max_entries=10, ttl_s=5.0)
    for i in range(4):
        owners.remember(f"r{i}", "sim-0", float(i))
    assert owners.owner("r0", 5.0) == "sim-0"
    assert owners.owner("r0", 10.5) is None and len(owners) == 3
    owners.resize(2, 5.0)
    assert len(owners) == 2 and owners.owner("r1", 6.0) is None
    with pytest.raises(ValueError):
        ResponseOwners(0, 1.0)


def test_ids_are_read_from_whole_bodies_and_stream_heads() -> None:
    assert id_in_body(orjson.dumps({"id": "resp_1", "object": "response"})) == "resp_1"
    assert id_in_body(b"not json") is None
    assert id_in_body(b"[1, 2]") is None
    assert id_in_body(orjson.dumps({"id": "x" * 300})) is None  # not an id an engine made
    created = {"type": "response.created", "response": {"id": "resp_2", "status": "in_progress"}}
    head = b"event: response.created\r\ndata: " + orjson.dumps(created) + b"\r\n\r\nevent: response.in_progress\n"
    assert id_in_stream_head(head) == "resp_2"
    assert id_in_stream_head(b'event: response.created\ndata: {"type": "response.cre') is None  # cut
    assert id_in_stream_head(b'data: {"type": "response.output_text.delta", "delta": "x"}\n') is None
    assert id_in_stream_head(b"event: response.created\n") is None


def test_a_404_is_not_found_here_only_when_it_names_the_id() -> None:
    body = orjson.dumps({"error": {"message": "Response with id 'resp_9' not found.", "type": "invalid_request_error"}})
    assert not_found_here(404, body, "resp_9")
    assert not not_found_here(404, body, "resp_8")
    assert not not_found_here(400, body, "resp_9")
    assert not not_found_here(404, b'{"error": {"message": "Unknown path /v1/responses."}}', "resp_9")


def _state(body: dict[str, Any], api: Api = Api.RESPONSES) -> RequestState:
    raw = orjson.dumps(body)
    return RequestState("req-1", parse_request(api, raw), raw, None, [], None, 0.0)  # type: ignore[arg-type]


def test_previous_response_id_only_on_responses_requests() -> None:
    assert previous_response_id(_state({"model": "m", "input": "hi", "previous_response_id": "resp_1"}).request) == (
        "resp_1"
    )
    assert previous_response_id(_state({"model": "m", "input": "hi"}).request) is None
    chat = _state({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, Api.CHAT)
    assert previous_response_id(chat.request) is None


def _backend(name: str) -> BackendState:
    return BackendState(Backend(name=name, url="http://127.0.0.1:9"))


def _affinity(**section: Any) -> tuple[ResponseAffinity, RouterConfig, CollectorRegistry]:
    config = RouterConfig.model_validate({"response_affinity": section})
    registry = CollectorRegistry()
    clock = iter(float(i) for i in range(1000))
    return ResponseAffinity(config.response_affinity, registry, lambda: next(clock)), config, registry


def _count(registry: CollectorRegistry, outcome: str) -> float:
    return registry.get_sample_value("continuum_response_affinity_total", {"outcome": outcome}) or 0.0


def test_a_known_id_goes_to_its_owner_and_an_unknown_one_is_probed() -> None:
    affinity, config, registry = _affinity()
    candidates = [_backend("sim-0"), _backend("sim-1"), _backend("sim-2")]
    created = {"type": "response.created", "response": {"id": "resp_a"}}
    affinity.learn_stream("sim-2", b"event: response.created\ndata: " + orjson.dumps(created) + b"\n\n")
    affinity.learn_body("sim-1", orjson.dumps({"id": "resp_b"}))
    affinity.learn_body("sim-1", b"{}")
    continuing = _state({"model": "m", "input": "next", "previous_response_id": "resp_a"})
    chosen = affinity.route(continuing, config.response_affinity, candidates)
    assert chosen is not None and chosen.name == "sim-2" and continuing.probe_response is None
    # the owner is not a candidate now (unhealthy, or tried already): no choice, no probing
    assert affinity.route(continuing, config.response_affinity, candidates[:2]) is None
    unknown = _state({"model": "m", "input": "next", "previous_response_id": "resp_zzz"})
    assert affinity.route(unknown, config.response_affinity, candidates) is None
    assert unknown.probe_response == "resp_zzz"
    fresh = _state({"model": "m", "input": "first"})
    assert affinity.route(fresh, config.response_affinity, candidates) is None and fresh.probe_response is None
    counts = {o: _count(registry, o) for o in ("owner", "owner_unavailable", "unknown", "learned", "no_id")}
    assert counts == {"owner": 1, "owner_unavailable": 1, "unknown": 1, "learned": 2, "no_id": 1}


def test_switched_off_or_without_probing() -> None:
    affinity, config, _ = _affinity(enabled=False)
    affinity.learn_body("sim-1", orjson.dumps({"id": "resp_b"}))
    state = _state({"model": "m", "input": "next", "previous_response_id": "resp_b"})
    assert affinity.route(state, config.response_affinity, [_backend("sim-1")]) is None
    affinity, config, _ = _affinity(probe=False)
    state = _state({"model": "m", "input": "next", "previous_response_id": "resp_c"})
    assert affinity.route(state, config.response_affinity, [_backend("sim-1")]) is None
    assert state.probe_response is None
    # a reload applies new bounds to what is remembered
    affinity, config, _ = _affinity(max_entries=5)
    for i in range(5):
        affinity.learn_body("sim-1", orjson.dumps({"id": f"resp_{i}"}))
    affinity.reload(RouterConfig.model_validate({"response_affinity": {"max_entries": 2}}))
    assert len(affinity.owners) == 2


def test_learnt_ids_are_handed_to_the_load_view_and_adopted_from_it() -> None:
    affinity, config, registry = _affinity()
    affinity.learn_body("sim-0", orjson.dumps({"id": "resp_before"}))
    assert affinity.take_shared(10) == []  # no load view yet: nothing queued
    affinity.share()
    for i in range(5):
        affinity.learn_body(f"sim-{i % 2}", orjson.dumps({"id": f"resp_{i}"}))
    assert affinity.take_shared(3) == [("resp_0", "sim-0"), ("resp_1", "sim-1"), ("resp_2", "sim-0")]
    assert affinity.take_shared(3) == [("resp_3", "sim-1"), ("resp_4", "sim-0")]
    assert affinity.take_shared(3) == []
    other, _, other_registry = _affinity()
    other.adopt([("resp_x", "sim-2")])
    state = _state({"model": "m", "input": "next", "previous_response_id": "resp_x"})
    chosen = other.route(state, config.response_affinity, [_backend("sim-1"), _backend("sim-2")])
    assert chosen is not None and chosen.name == "sim-2"
    assert _count(other_registry, "adopted") == 1 and _count(registry, "learned") == 6


def test_a_full_share_queue_drops_the_oldest_and_counts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("continuum_ingress.response_affinity.SHARE_QUEUE", 2)
    affinity, _, registry = _affinity()
    affinity.share()
    for i in range(3):
        affinity.learn_body("sim-0", orjson.dumps({"id": f"resp_{i}"}))
    assert affinity.take_shared(10) == [("resp_1", "sim-0"), ("resp_2", "sim-0")]
    assert _count(registry, "share_dropped") == 1


class _Upstream:
    """An upstream answer as the transport hands it over (status, headers, body chunks)."""

    def __init__(self, status: int, content_type: bytes, chunks: list[bytes], fail: bool = False) -> None:
        self.status, self.headers, self.read_timeout = status, [(b"content-type", content_type)], 1.0
        self.chunks, self.fail, self.closed = chunks, fail, False

    async def stream(self) -> Any:
        for chunk in self.chunks:
            yield chunk
        if self.fail:
            raise UpstreamError("the backend went away")

    async def read(self) -> bytes:
        return b"".join(self.chunks)

    async def aclose(self) -> None:
        self.closed = True


async def test_a_retrieved_stream_is_relayed_as_it_comes_and_closed() -> None:
    events = [b"event: response.created\ndata: {}\n\n", b"event: response.completed\ndata: {}\n\n"]
    upstream = _Upstream(200, b"text/event-stream; charset=utf-8", events)
    assert is_event_stream(upstream)  # type: ignore[arg-type]
    assert [c async for c in relay_stream(upstream)] == events and upstream.closed  # type: ignore[arg-type]
    broken = _Upstream(200, b"text/event-stream", events[:1], fail=True)
    assert [c async for c in relay_stream(broken)] == events[:1] and broken.closed  # type: ignore[arg-type]
    assert not is_event_stream(_Upstream(200, b"application/json", [b"{}"]))  # type: ignore[arg-type]
    assert not is_event_stream(_Upstream(404, b"text/event-stream", []))  # type: ignore[arg-type]
