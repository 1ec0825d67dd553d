"""Built-in per-attempt body rewrites (BodyRewriter): salt echo and Anthropic cache_control.

Both depend on the backend the attempt goes to, so they run after selection, on a fresh copy
of the client's body for every attempt.
"""

from __future__ import annotations

from typing import Any

from continuum_common.config import Backend
from continuum_common.salt import make_salt
from continuum_ingress.metrics import IngressMetrics
from continuum_ingress.policy.cache_control import inject_cache_control, should_inject
from continuum_ingress.protocol.apis import Api
from continuum_ingress.snapshot import RouterSnapshot
from continuum_ingress.state import RequestState

SALT_BACKEND_TYPES = frozenset({"vllm", "trtllm"})
# vLLM and TRT-LLM accept `cache_salt` on these request types.
SALT_APIS = frozenset({Api.CHAT, Api.COMPLETIONS})


class SaltEcho:
    """Salt echo (docs/hashing.md, continuum_common.salt): give vLLM / TRT-LLM backends a
    `cache_salt` that carries the HMAC-authenticated prefix key, bound to the backend's name, so
    the KV listener can attribute the engine's block chain without detokenizing. Only when the
    request has a prefix key and the caller did not send its own `cache_salt` (theirs wins).

    Only for backends matched by prefix key (`kv_cache_index` mode `prefix_key`): precise
    matching recomputes the engine's block hashes, which a salt the client did not send would
    change, and approximate matching has no use for it."""

    def __init__(self, secret: bytes, metrics: IngressMetrics) -> None:
        self._secret = secret
        self._metrics = metrics

    async def rewrite(
        self, state: RequestState, snapshot: RouterSnapshot, backend: Backend, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        if (
            state.prefix_key is None
            or backend.type not in SALT_BACKEND_TYPES
            or state.api not in SALT_APIS
            or "cache_salt" in body
            or _match_mode(snapshot, backend.name) != "prefix_key"
        ):
            return None
        self._metrics.salt_echo.inc()
        return {**body, "cache_salt": make_salt(self._secret, backend.name, state.prefix_key)}


def _match_mode(snapshot: RouterSnapshot, backend: str) -> str:
    kv = snapshot.config.kv_cache_index
    group = snapshot.config.match_group_of(backend)
    return group.mode if group is not None else kv.default_mode


class AnthropicCacheControl:
    """The seed's cache_control injection rules (policy.cache_control)."""

    def __init__(self, metrics: IngressMetrics) -> None:
        self._metrics = metrics

    async def rewrite(
        self, state: RequestState, snapshot: RouterSnapshot, backend: Backend, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        if state.api is not Api.MESSAGES:
            return None
        force = snapshot.config.prefix_routing.anthropic_cache_control_injection
        if not should_inject(backend.type, backend.anthropic_auto_cache_control, force):
            return None
        new = inject_cache_control(body)
        if new is not None:
            self._metrics.cache_control_injected.inc()
        return new
