"""Stored Responses conversations through the ingress: simulated engines that store responses
(each in its own process, as vLLM does), the OpenAI SDK as the client, RoundRobin as the
strategy, so that only response affinity keeps a conversation on the engine that stored it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import pytest_asyncio

from continuum_common.procs import NatsServer
from continuum_ingress.stored_responses import MAX_CANCEL_BODY
from continuum_sim import SimFleet
from continuum_testing.ingress_harness import running_ingress

INSTRUCTIONS = "You are the support assistant of a large shop. Answer briefly and politely. " * 4


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(3, time_scale=0.01) as running:
        yield running


def _config(fleet: SimFleet, **affinity: object) -> dict[str, object]:
    return {"backends": fleet.router_backends(), "selection_strategy": "RoundRobin", "response_affinity": affinity}


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="unused", base_url=f"{url}/v1", max_retries=0)


def _count(app: object, outcome: str) -> float:
    registry = app.metrics.registry  # type: ignore[attr-defined]
    return registry.get_sample_value("continuum_response_affinity_total", {"outcome": outcome}) or 0.0


async def test_a_stored_conversation_stays_with_the_engine_that_stored_it(fleet: SimFleet) -> None:
    model = fleet.endpoints[0].model
    async with running_ingress(_config(fleet)) as ing:
        oc = _client(ing.url)
        raw = await oc.responses.with_raw_response.create(
            model=model, instructions=INSTRUCTIONS, input="Where is my parcel?", max_output_tokens=8
        )
        home, previous = raw.headers["x-continuum-backend"], raw.parse()
        cached = []
        for turn in range(4):  # RoundRobin alone would send each turn to the next engine
            raw = await oc.responses.with_raw_response.create(
                model=model, input=f"And the next one, number {turn}?", previous_response_id=previous.id,
                max_output_tokens=8,
            )  # fmt: skip
            assert raw.headers["x-continuum-backend"] == home
            previous = raw.parse()
            assert previous.usage is not None
            cached.append(previous.usage.input_tokens_details.cached_tokens)
        # streamed turns: the id of `response.created` is learnt from the stream's first event
        for turn in range(2):
            events = [
                e async for e in await oc.responses.create(
                    model=model, input=f"Streamed question {turn}", previous_response_id=previous.id,
                    max_output_tokens=8, stream=True,
                )
            ]  # fmt: skip
            assert events[-1].type in ("response.completed", "response.incomplete")
            previous = events[-1].response
            assert previous.usage is not None and previous.usage.input_tokens_details.cached_tokens > 0
        await oc.close()
        assert _count(ing.app, "owner") == 6 and _count(ing.app, "unknown") == 0
        assert _count(ing.app, "learned") == 7
    assert all(c > 0 for c in cached)  # the history is in the engine's prefix cache


async def test_another_replica_finds_the_engine_by_asking(fleet: SimFleet) -> None:
    """A replica that never saw the id (another one answered it) passes over the engines that
    answer 404 for it, and then knows the conversation's next id itself."""
    model = fleet.endpoints[0].model
    async with running_ingress(_config(fleet)) as first, running_ingress(_config(fleet)) as second:
        a, b = _client(first.url), _client(second.url)
        # RoundRobin starts at the first engine in both routers: one request first moves the
        # conversation to the second engine, so the other router's first pick does not hold it.
        await a.responses.create(model=model, input="Warm-up", max_output_tokens=4)
        opened = await a.responses.with_raw_response.create(model=model, input="Hello", max_output_tokens=8)
        home = opened.headers["x-continuum-backend"]
        previous = opened.parse()
        for turn in range(3):
            raw = await b.responses.with_raw_response.create(
                model=model, input=f"turn {turn}", previous_response_id=previous.id, max_output_tokens=8
            )
            assert raw.headers["x-continuum-backend"] == home
            previous = raw.parse()
        await a.close()
        await b.close()
        assert _count(second.app, "unknown") == 1  # only the first continuation had to ask
        assert _count(second.app, "owner") == 2
        assert _count(second.app, "probed") == 1  # the first engine said 404, the second had it
        retries = second.app.metrics.registry.get_sample_value(
            "continuum_ingress_retries_total", {"reason": "response_not_found"}
        )
        assert retries == 1


async def test_an_id_no_engine_holds_is_a_404_after_asking_each(fleet: SimFleet) -> None:
    model = fleet.endpoints[0].model
    async with running_ingress(_config(fleet)) as ing:
        oc = _client(ing.url)
        with pytest.raises(openai.NotFoundError) as caught:
            await oc.responses.create(model=model, input="hi", previous_response_id="resp_nobody_has_this")
        await oc.close()
        error = caught.value
        assert (error.status_code, error.code, error.param) == (404, "response_not_found", "previous_response_id")
        assert "resp_nobody_has_this" in error.message
        assert _count(ing.app, "probed") == 3


async def test_without_affinity_the_next_turn_meets_an_engine_that_does_not_have_it(fleet: SimFleet) -> None:
    """The control: RoundRobin alone sends the continuation to another engine, which answers 404."""
    model = fleet.endpoints[0].model
    async with running_ingress(_config(fleet, enabled=False)) as ing:
        oc = _client(ing.url)
        first = await oc.responses.create(model=model, input="Hello", max_output_tokens=8)
        with pytest.raises(openai.NotFoundError):
            await oc.responses.create(model=model, input="next", previous_response_id=first.id, max_output_tokens=8)
        await oc.close()


async def test_replicas_learn_each_others_ids_from_the_load_reports(fleet: SimFleet, nats_server: NatsServer) -> None:
    """Two replicas sharing a load view over NATS: the id one of them learnt reaches the other
    with its next report, and the other routes the next turn straight to the owner."""
    model = fleet.endpoints[0].model
    config = {
        **_config(fleet),
        "bus": {"embedded": False, "url": nats_server.url},
        "load_sharing": {"bus": "always", "interval_ms": 20, "stale_after_ms": 1000},
    }
    async with running_ingress(config) as first, running_ingress(config) as second:
        a, b = _client(first.url), _client(second.url)
        await a.responses.create(model=model, input="Warm-up", max_output_tokens=4)  # see above
        opened = await a.responses.with_raw_response.create(model=model, input="Hello", max_output_tokens=8)
        home, previous = opened.headers["x-continuum-backend"], opened.parse()
        async with asyncio.timeout(5):
            while _count(second.app, "adopted") < 2:
                await asyncio.sleep(0.01)
        raw = await b.responses.with_raw_response.create(
            model=model, input="next", previous_response_id=previous.id, max_output_tokens=8
        )
        await a.close()
        await b.close()
        assert raw.headers["x-continuum-backend"] == home
        assert (_count(second.app, "owner"), _count(second.app, "unknown"), _count(second.app, "probed")) == (1, 0, 0)


async def test_retrieve_list_and_delete_reach_the_engine_that_stored_it(fleet: SimFleet) -> None:
    """GET /v1/responses/{id}, its input_items and DELETE go to the engine that stored the
    response, from the replica that saw it and, by asking, from one that did not."""
    model = fleet.endpoints[0].model
    async with running_ingress(_config(fleet)) as first, running_ingress(_config(fleet)) as second:
        a, b = _client(first.url), _client(second.url)
        await a.responses.create(model=model, input="Warm-up", max_output_tokens=4)  # see above
        opened = await a.responses.with_raw_response.create(model=model, input="Hello", max_output_tokens=8)
        home, created = opened.headers["x-continuum-backend"], opened.parse()
        for client in (a, b):
            raw = await client.responses.with_raw_response.retrieve(created.id)
            assert raw.headers["x-continuum-backend"] == home
            retrieved = raw.parse()
            assert (retrieved.id, retrieved.output_text) == (created.id, created.output_text)
        assert _count(second.app, "probed") == 1  # the first engine it asked did not have it
        items = await b.responses.input_items.list(created.id)
        assert [item.role for item in items.data] == ["user"]  # type: ignore[union-attr]
        deleted = await b.responses.with_raw_response.delete(created.id)
        assert deleted.headers["x-continuum-backend"] == home
        assert deleted.http_response.json() == {"id": created.id, "object": "response.deleted", "deleted": True}
        with pytest.raises(openai.NotFoundError) as caught:
            await a.responses.retrieve(created.id)
        assert caught.value.code == "response_not_found" and created.id in caught.value.message
        with pytest.raises(openai.NotFoundError):
            await a.responses.create(model=model, input="next", previous_response_id=created.id, max_output_tokens=8)
        await a.close()
        await b.close()


async def test_a_cancel_with_a_body_past_the_limit_is_refused_unread(fleet: SimFleet) -> None:
    async with running_ingress(_config(fleet)) as ing, httpx.AsyncClient(base_url=ing.url, timeout=10) as http:
        refused = await http.post("/v1/responses/resp_x/cancel", content=b"x" * (MAX_CANCEL_BODY + 1))
        assert refused.status_code == 413 and refused.json()["error"]["message"] == "A cancel request carries no body."
        # The simulator has no cancel route: its own 404 does not name the id, so it is relayed.
        relayed = await http.post("/v1/responses/resp_x/cancel")
        assert relayed.status_code == 404 and relayed.headers["x-continuum-backend"].startswith("sim-")
