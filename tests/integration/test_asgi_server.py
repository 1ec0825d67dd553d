"""continuum_common.asgi_server: the embedded uvicorn server stops when asked, not at its next
poll, and keeps its Date header fresh while it serves (real loopback sockets)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from continuum_common import asgi_server
from continuum_common.asgi_server import EmbeddedServer


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_a_stop_request_wakes_the_server_without_waiting_for_its_next_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With the main loop's only timer an hour away, only the stop request itself can end it.
    monkeypatch.setattr(asgi_server, "DATE_REFRESH_S", 3600.0)
    server = EmbeddedServer(app)
    await server.start()
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        assert (await client.get("/")).text == "ok"
        await asyncio.wait_for(server.stop(), 5)
        with pytest.raises(httpx.TransportError):
            await client.get("/")


async def test_a_stop_before_the_server_started_its_loop_still_stops_it() -> None:
    server = EmbeddedServer(app)
    server.request_stop()
    await asyncio.wait_for(server.serve(), 5)
    assert server.server.should_exit


async def test_the_date_header_is_refreshed_while_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asgi_server, "DATE_REFRESH_S", 0.01)
    async with EmbeddedServer(app) as server:
        state = server.server.server_state
        first = state.default_headers
        assert any(name == b"date" for name, _ in first)
        async with asyncio.timeout(5):
            while state.default_headers is first:
                await asyncio.sleep(0.01)
