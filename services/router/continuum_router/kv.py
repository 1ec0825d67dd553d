"""The Tier 4 services of `continuum-router up` (registered in up.SERVICES), and the `--demo`
files they need.

* `listener`: the KV listener, in this process, when `up` has a listener file
  (`--listener-config`, or the one `--demo` writes from `fleet.listener_sources()`). When the
  router's bus is embedded, the listener is pointed at the embedded nats-server whatever its file
  says.
* `indexer`: the indexer, in this process, when `kv_cache_index` is enabled with
  `backend: redis` (with `backend: memory` the ingress keeps the index itself: no indexer).

`--demo` turns Tier 4 on: prefix routing, the KV index (memory backend: no Redis needed) with
the demo engines as one precise match group (the engines' vLLM block hashes, token ids from their
own /tokenize), the listener publishing the engines' block events, and an admin token in
`.continuum/admin-token` so the admin endpoints can be tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from continuum_common.config.listener import ListenerConfig
from continuum_common.config.loader import load_listener_config

if TYPE_CHECKING:
    from continuum_router.up import UpContext

log = logging.getLogger("continuum.up")

SALT_FILE = "salt-secret"
ADMIN_TOKEN_FILE = "admin-token"
DEMO_LISTENER_FILE = "demo-listener.yaml"


def secret_file(state_dir: Path, name: str) -> Path:
    """A random secret in `state_dir/name`, created once (mode 0600) and reused afterwards, so
    engines keep their cache salts and the admin token stays the same across restarts."""
    path = (state_dir / name).resolve()
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(secrets.token_urlsafe(32))
    return path


def demo_kv_sections(state_dir: Path, *, model: str, block_size: int, hash_seed: str) -> dict[str, Any]:
    """The router sections `--demo` adds for Tier 4: the demo engines as one precise group."""
    group = {
        "name": "demo",
        "models": [model],
        "mode": "precise",
        "engine": "vllm",
        "block_size": block_size,
        "hash_seed": hash_seed,
    }
    return {
        "prefix_routing": {"enabled": True},
        "kv_cache_index": {"enabled": True, "backend": "memory", "groups": [group]},
        "admin": {"token_file": str(secret_file(state_dir, ADMIN_TOKEN_FILE))},
    }


def demo_listener_config(sources: Sequence[dict[str, Any]], *, nats_url: str) -> dict[str, Any]:
    """The listener file for the demo engines: their block events, as they come."""
    return {
        "listen": "127.0.0.1:0",
        "bus": {"embedded": False, "url": nats_url},
        "sources": [{**s, "publish": "blocks"} for s in sources],
    }


def _listener_config(ctx: UpContext) -> ListenerConfig | None:
    if ctx.fleet is not None and ctx.listener_config is None:
        assert ctx.nats_url is not None
        data = demo_listener_config(ctx.fleet.listener_sources(), nats_url=ctx.nats_url)
        path = ctx.data_dir / DEMO_LISTENER_FILE
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return ListenerConfig.model_validate(data)
    if ctx.listener_config is None:
        return None
    cfg = load_listener_config(ctx.listener_config)
    if ctx.config.bus.embedded and ctx.nats_url is not None:
        bus = (cfg.bus or ctx.config.bus).model_copy(update={"embedded": False, "url": ctx.nats_url})
        cfg = cfg.model_copy(update={"bus": bus})
    return cfg


@contextlib.asynccontextmanager
async def listener_service(ctx: UpContext) -> AsyncIterator[str | None]:
    cfg = _listener_config(ctx)
    if cfg is None:
        yield None
        return
    from continuum_listener.app import running
    from continuum_listener.config import settings_from

    async with running(settings_from(cfg, source=str(ctx.listener_config or DEMO_LISTENER_FILE))) as app:
        host = cfg.listen.rpartition(":")[0]
        yield f"{len(cfg.sources)} engine event stream(s); SSE on http://{host}:{app.port}/events/<backend>"


@contextlib.asynccontextmanager
async def indexer_service(ctx: UpContext) -> AsyncIterator[str | None]:
    section = ctx.config.kv_cache_index
    if not section.enabled or section.backend != "redis":
        yield None  # memory: the ingress holds the index itself
        return
    from continuum_indexer.app import IndexerApp
    from continuum_indexer.config import IndexerSettings

    app = IndexerApp(IndexerSettings(config=ctx.config, nats_url=ctx.nats_url, listen=None))
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop), name="continuum-indexer")
    started = asyncio.create_task(app.started.wait())
    await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        started.cancel()
        await task  # raises the start-up error
    try:
        yield "JetStream CONTINUUM_KV -> Redis KV index"
    finally:
        stop.set()
        await task
