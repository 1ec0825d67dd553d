"""`/admin/*`: bearer-token auth and the ingress's own admin endpoints.

Every route mounted under /admin - these and the ones other components add through
`IngressApp(extra_admin_routes=...)` - sits behind `AdminAuth`: `Authorization: Bearer <token>`
compared in constant time (hmac.compare_digest) against every configured token. With no token
configured the admin API is locked (401 for everyone), never open.
"""

from __future__ import annotations

import hmac
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from continuum_common.ring import RouteLabel
from continuum_ingress.asgi import Receive, Scope, Send, send_json
from continuum_ingress.config_holder import ConfigHolder
from continuum_ingress.metrics import IngressMetrics
from continuum_ingress.pool import BackendPool

_UNAUTHORIZED = {
    "error": {
        "message": "A valid admin bearer token is required (Authorization: Bearer <token>).",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_admin_token",
    }
}


def token_matches(presented: bytes, tokens: tuple[bytes, ...]) -> bool:
    """Constant-time over each configured token; every token is compared (no early exit)."""
    ok = False
    for token in tokens:
        ok |= hmac.compare_digest(presented, token)
    return ok and bool(presented)


def bearer(scope: Scope) -> bytes:
    for name, value in scope["headers"]:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            token: bytes = value[7:].strip()
            return token
    return b""


class AdminAuth:
    """ASGI middleware in front of the admin router."""

    def __init__(self, app: Any, holder: ConfigHolder) -> None:
        self.app = app
        self.holder = holder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not token_matches(bearer(scope), self.holder.current.admin_tokens):
            await send_json(send, 401, _UNAUTHORIZED, [(b"www-authenticate", b'Bearer realm="continuum-admin"')])
            return
        await self.app(scope, receive, send)


class AdminEndpoints:
    def __init__(self, holder: ConfigHolder, pool: BackendPool, metrics: IngressMetrics) -> None:
        self.holder = holder
        self.pool = pool
        self.metrics = metrics

    def routes(self) -> list[Route]:
        return [
            Route("/prefix-routing/stats", self.prefix_routing_stats, methods=["GET"]),
            Route("/backends", self.backends, methods=["GET"]),
            Route("/config/reload", self.reload, methods=["POST"]),
        ]

    async def prefix_routing_stats(self, request: Request) -> Response:
        """The seed's exact shape (seed §"GET /admin/prefix-routing/stats")."""
        snapshot = self.holder.current
        routing = snapshot.config.prefix_routing
        stats = self.metrics.prefix_stats
        total = stats.total
        overflow = stats.decisions[RouteLabel.OVERFLOW]
        distribution = []
        for name in snapshot.backends:
            state = self.pool.get(name)
            distribution.append({"backend": name, "in_flight_requests": state.local_in_flight if state else 0})
        return JSONResponse(
            {
                "enabled": routing.enabled,
                "config": {
                    "max_prefix_length": routing.max_prefix_length,
                    "load_factor_epsilon": routing.load_factor_epsilon,
                    "virtual_nodes": routing.virtual_nodes,
                    "anthropic_cache_control_injection": routing.anthropic_cache_control_injection,
                },
                "routing_decisions": {
                    "total": total,
                    "prefix_hash": stats.decisions[RouteLabel.PREFIX_HASH],
                    "overflow": overflow,
                    "fallback": stats.decisions[RouteLabel.FALLBACK],
                    "overflow_rate": f"{overflow / total if total else 0.0:.4f}",
                },
                "backend_distribution": distribution,
                "unique_prefixes": stats.unique.count(),
            }
        )

    async def backends(self, request: Request) -> Response:
        snapshot = self.holder.current
        out = []
        for name, spec in snapshot.backends.items():
            state = self.pool.get(name)
            if state is None:
                continue
            out.append(
                {
                    "name": name,
                    "type": spec.type,
                    "models": list(spec.models),
                    "weight": spec.weight,
                    "healthy": state.healthy,
                    "circuit": state.breaker_state.name.lower(),
                    "in_flight_requests": state.local_in_flight,
                    "other_replicas_in_flight_requests": state.remote_in_flight,
                    "latency_ewma_ms": None if state.latency is None else round(state.latency * 1000, 3),
                    "success_rate": round(state.success_rate, 4),
                }
            )
        return JSONResponse(
            {
                "generation": snapshot.generation,
                "selection_strategy": snapshot.config.selection_strategy.value,
                "backends": out,
            }
        )

    async def reload(self, request: Request) -> Response:
        ok = self.holder.reload()
        return JSONResponse(
            {"success": ok, "generation": self.holder.current.generation}, status_code=200 if ok else 422
        )
