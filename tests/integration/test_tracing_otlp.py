"""Traces end to end, exported over OTLP/HTTP to a real receiver (protobuf decoded in the test):
one trace per request across ingress -> cache -> selection -> upstream, with the backend getting
the upstream span as its `traceparent`; listener batch -> JetStream -> indexer apply as linked
spans. And nothing at all with tracing off."""

from __future__ import annotations

import asyncio

import httpx

from continuum_common.config.listener import ListenerConfig
from continuum_common.procs import NatsServer, RedisServer
from continuum_indexer.app import IndexerApp
from continuum_listener.app import running as running_listener
from continuum_listener.config import settings_from
from continuum_sim import SimFleet
from continuum_testing.indexer_harness import router_config, running, settings, wait_drained
from continuum_testing.ingress_harness import running_ingress, stub_backends
from continuum_testing.otlp_receiver import otlp_receiver
from continuum_testing.upstream_stub import running_stubs

BODY = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "trace me"}]}
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


async def test_one_trace_per_request_reaches_the_backend() -> None:
    async with otlp_receiver() as receiver, running_stubs("a") as stubs:
        cfg = {
            "backends": stub_backends(stubs),
            "response_cache": {"enabled": True, "backend": "memory"},
            "tracing": {"enabled": True, "otlp_endpoint": receiver.url, "service_name": "ct"},
        }
        async with running_ingress(cfg) as ing, httpx.AsyncClient(base_url=ing.url, timeout=10) as c:
            plain = await c.post("/v1/chat/completions", json=BODY)
            traced = await c.post(
                "/v1/chat/completions",
                json={**BODY, "stream": True},
                headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            )
            hit = await c.post("/v1/chat/completions", json=BODY)  # the first answer, from the cache
        # Leaving the ingress flushed its spans.
        assert plain.status_code == traced.status_code == hit.status_code == 200
        assert hit.headers["x-cache"] == "HIT"
        received = stubs[0].stub.requests
    servers = [s for s in receiver.spans if s.kind == "server"]
    assert len(servers) == 3 and {s.service for s in receiver.spans} == {"ct-ingress"}
    assert all(s.name == "chat_completions" and s.attributes["gen_ai.request.model"] == "m" for s in servers)
    for server, backend_request in zip(servers[:2], received, strict=True):
        spans = receiver.trace(server.trace_id)
        children = {s.name: s for s in spans if s.parent_span_id == server.span_id}
        assert set(children) == {"cache.lookup", "route.select", "upstream a"}
        upstream = children["upstream a"]
        assert upstream.kind == "client" and upstream.attributes["continuum.outcome"] == "success"
        # The backend continues the same trace under the upstream span.
        _, trace_id, parent, _ = backend_request.headers["traceparent"].split("-")
        assert (trace_id, parent) == (server.trace_id, upstream.span_id)
    # The client's own trace is continued, not replaced.
    streamed = servers[1]
    assert (streamed.trace_id, streamed.parent_span_id) == (CLIENT_TRACE, CLIENT_SPAN)
    # A cache hit is one request span with its lookup, and no upstream.
    names = {s.name for s in receiver.trace(servers[2].trace_id)}
    assert names == {"chat_completions", "cache.lookup"}


async def test_tracing_off_exports_nothing_and_forwards_the_clients_traceparent() -> None:
    async with otlp_receiver() as receiver, running_stubs("a") as stubs:
        cfg = {"backends": stub_backends(stubs), "tracing": {"enabled": False, "otlp_endpoint": receiver.url}}
        header = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
        async with running_ingress(cfg) as ing, httpx.AsyncClient(base_url=ing.url, timeout=10) as c:
            r = await c.post("/v1/chat/completions", json=BODY, headers={"traceparent": header})
        assert r.status_code == 200
        assert stubs[0].stub.requests[0].headers["traceparent"] == header
    assert receiver.exports == 0 and receiver.spans == []


async def test_listener_batches_and_indexer_writes_are_linked(
    nats_server: NatsServer, redis_server: RedisServer
) -> None:
    async with otlp_receiver() as receiver:
        tracing = {"enabled": True, "otlp_endpoint": receiver.url, "service_name": "ct"}
        async with SimFleet(1, time_scale=0.001) as fleet:
            sources = [{**s, "publish": "blocks"} for s in fleet.listener_sources()]
            listener_cfg = ListenerConfig.model_validate(
                {
                    "listen": "127.0.0.1:0",
                    "bus": {"embedded": False, "url": nats_server.url},
                    "sources": sources,
                    "tracing": tracing,
                }
            )
            base = router_config(nats_server.url, redis_server.url)
            indexer_cfg = base.model_copy(update={"tracing": base.tracing.model_copy(update=tracing)})
            async with running_listener(settings_from(listener_cfg)) as listener:
                app = IndexerApp(settings(indexer_cfg, batch=100))
                async with running(app):
                    backend = fleet.endpoints[0].name
                    async with asyncio.timeout(10):
                        while not listener.pipelines[backend].stats.connected:
                            await asyncio.sleep(0.02)
                    async with httpx.AsyncClient(base_url=fleet.urls[0], timeout=30) as client:
                        body = {
                            "model": fleet.endpoints[0].model,
                            "messages": [{"role": "user", "content": "link the spans " * 20}],
                            "max_tokens": 4,
                        }
                        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
                    await asyncio.sleep(0.3)
                    await wait_drained(nats_server.url)
    producers = {(s.trace_id, s.span_id): s for s in receiver.spans if s.kind == "producer"}
    consumers = [s for s in receiver.spans if s.kind == "consumer"]
    assert producers and consumers
    assert {s.service for s in producers.values()} == {"ct-kv-listener"}
    assert {s.service for s in consumers} == {"ct-indexer"}
    linked = {link for s in consumers for link in s.links}
    # Every batch the listener published is linked from the index write that applied it.
    assert set(producers) <= linked, (len(producers), len(linked & set(producers)))
    assert all(s.name == "kv.apply block batches" for s in consumers)
