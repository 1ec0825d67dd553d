"""Run the ingress for tests: a real uvicorn server on a free loopback port, composed as the
launcher composes it (continuum_router.compose: with the embedded KV index of the memory backend)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from continuum_common.config import RouterConfig, parse
from continuum_ingress.app import IngressApp
from continuum_ingress.server import RunningServer
from continuum_router.compose import build_ingress
from continuum_testing.upstream_stub import RunningStub


class RunningIngress:
    def __init__(self, app: IngressApp, server: RunningServer) -> None:
        self.app = app
        self.server = server

    @property
    def url(self) -> str:
        return self.server.url


def stub_backends(
    stubs: Sequence[RunningStub], *, type: str = "vllm", models: Sequence[str] = ("m",), **extra: Any
) -> list[dict[str, Any]]:
    """Backend entries for running stubs (health checks every 100 ms so tests see them fast)."""
    return [
        {"name": s.name, "url": s.url, "type": type, "models": list(models), "health_check_interval_ms": 100, **extra}
        for s in stubs
    ]


def router_config(data: dict[str, Any]) -> RouterConfig:
    return parse(RouterConfig, data, source="test config")


@contextlib.asynccontextmanager
async def running_ingress(config: dict[str, Any] | str | Path, **kwargs: Any) -> AsyncIterator[RunningIngress]:
    """The ingress for `config` (a dict is validated like a file) listening on loopback."""
    source: RouterConfig | str | Path = router_config(config) if isinstance(config, dict) else config
    app = build_ingress(source, **kwargs)
    async with RunningServer(app.asgi, edge=app.edge) as server:
        yield RunningIngress(app, server)
