"""Immutable routing snapshots: everything a request needs from the configuration.

A request takes the current snapshot when it starts and keeps it to the end (retries included),
so a hot reload never changes the rules under a request in flight. A reload builds a new
snapshot - backends, routes, strategy, CHWBL rings (virtual_nodes / epsilon), injection flag,
admin tokens - and swaps one reference.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from continuum_common.config import Backend, RouterConfig
from continuum_common.config.secrets import read_secret
from continuum_ingress.policy.strategies import Strategy, build_strategy
from continuum_ingress.pool import BackendPool
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.dialects import UpstreamDialect
from continuum_ingress.transport import Upstream, UpstreamSet


@dataclass(eq=False)
class RouterSnapshot:
    generation: int
    config: RouterConfig
    # Backends that may take client traffic (enabled, not internal), in configuration order.
    backends: Mapping[str, Backend]
    # api -> model -> eligible backend names (listed for the model, or serving every model).
    routes: Mapping[Api, Mapping[str, tuple[str, ...]]]
    # api -> backends with an empty `models` list (they serve any model name).
    wildcard: Mapping[Api, tuple[str, ...]]
    models: tuple[str, ...]
    strategy: Strategy
    clients: Mapping[str, Upstream]
    api_keys: Mapping[str, str | None]
    admin_tokens: tuple[bytes, ...]
    users: int = field(default=0)

    def route(self, api: Api, model: str) -> tuple[str, ...]:
        names = self.routes[api].get(model)
        return self.wildcard[api] if names is None else names

    def knows_model(self, model: str) -> bool:
        return model in self.routes[Api.CHAT] or model in self.models


def split_tokens(secret: str | None) -> tuple[bytes, ...]:
    """Admin tokens: one secret may hold several (newline, comma or space separated) so a token
    can be rotated without a gap."""
    if not secret:
        return ()
    return tuple(t.encode() for t in re.split(r"[\s,]+", secret) if t)


class SnapshotFactory:
    """Builds snapshots and keeps the pool's live state and the HTTP clients in step with them."""

    def __init__(
        self,
        pool: BackendPool,
        clients: UpstreamSet,
        dialects: Mapping[str, UpstreamDialect],
        rng: random.Random | None = None,
    ) -> None:
        self.pool = pool
        self.clients = clients
        self.dialects = dialects
        self._rng = rng

    def build(self, cfg: RouterConfig, generation: int) -> RouterSnapshot:
        """Raises ConfigError (SecretError) before touching any live state, so a failed reload
        leaves the running snapshot as it was."""
        routable = [b for b in cfg.backends if b.enabled and not b.internal]
        api_keys = {
            b.name: read_secret(b.api_key_env, b.api_key_file, what=f"backends[{b.name}].api_key") for b in cfg.backends
        }
        tokens = split_tokens(read_secret(cfg.admin.token_env, cfg.admin.token_file, what="admin.token"))
        routes: dict[Api, dict[str, tuple[str, ...]]] = {}
        wildcard: dict[Api, tuple[str, ...]] = {}
        models = tuple(dict.fromkeys(m for b in routable for m in b.models))
        for api in Api:
            serving = [b for b in routable if self.dialects[b.type].supports(api)]
            wildcard[api] = tuple(b.name for b in serving if not b.models)
            routes[api] = {
                model: tuple(b.name for b in serving if not b.models or model in b.models) for model in models
            }
        strategy = build_strategy(
            cfg.selection_strategy,
            virtual_nodes=cfg.prefix_routing.virtual_nodes,
            epsilon=cfg.prefix_routing.load_factor_epsilon,
            rng=self._rng,
        )
        enabled = [b for b in cfg.backends if b.enabled]
        self.pool.sync(enabled)
        # Internal backends (embeddings for the semantic cache) get clients too, not routes.
        clients = self.clients.sync(enabled)
        return RouterSnapshot(
            generation=generation,
            config=cfg,
            backends={b.name: b for b in routable},
            routes=routes,
            wildcard=wildcard,
            models=models,
            strategy=strategy,
            clients=clients,
            api_keys=api_keys,
            admin_tokens=tokens,
        )
