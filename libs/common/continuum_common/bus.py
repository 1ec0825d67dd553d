"""NATS connection and JetStream setup shared by every service (the only place that turns a
`bus` config section into a live connection)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import BadRequestError, NotFoundError

from continuum_common.config.durations import format_duration
from continuum_common.config.router import Bus
from continuum_common.config.secrets import read_secret
from continuum_common.events import STREAM_NAME, SUBJECT_WILDCARD

log = logging.getLogger("continuum.bus")

Callback = Callable[[], Awaitable[None]]


def tls_context(cfg: Bus) -> ssl.SSLContext | None:
    if cfg.tls is None:
        return None
    ctx = ssl.create_default_context(cafile=cfg.tls.ca_file)
    if cfg.tls.cert_file and cfg.tls.key_file:
        ctx.load_cert_chain(cfg.tls.cert_file, cfg.tls.key_file)
    return ctx


def connect_options(cfg: Bus, *, url: str | None = None, name: str, no_echo: bool = False) -> dict[str, Any]:
    """nats.connect() keyword arguments for `cfg`; secrets are read here, never logged.
    `no_echo`: the server does not deliver this connection's own messages to its own
    subscriptions (for a client that only skips them)."""
    options: dict[str, Any] = {
        "servers": [u.strip() for u in (url or cfg.url).split(",")],
        "name": name,
        "no_echo": no_echo,
        "connect_timeout": cfg.connect_timeout_ms / 1000,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        # Outgoing messages buffered while disconnected are bounded (bytes).
        "pending_size": 8 * 1024 * 1024,
    }
    if cfg.user:
        options["user"] = cfg.user
        options["password"] = read_secret(cfg.password_env, cfg.password_file, what="bus.password")
    token = read_secret(cfg.token_env, cfg.token_file, what="bus.token")
    if token:
        options["token"] = token
    if cfg.creds_file:
        options["user_credentials"] = cfg.creds_file
    if cfg.inbox_prefix:
        options["inbox_prefix"] = cfg.inbox_prefix
    ctx = tls_context(cfg)
    if ctx is not None:
        options["tls"] = ctx
        if cfg.tls and cfg.tls.server_name:
            options["tls_hostname"] = cfg.tls.server_name
    return options


async def connect(
    cfg: Bus,
    *,
    name: str,
    url: str | None = None,
    on_disconnect: Callback | None = None,
    on_reconnect: Callback | None = None,
) -> NatsClient:
    async def _error(exc: Exception) -> None:
        text = str(exc)
        if "permissions violation" in text:
            # The server names the subject (no payload, no secret): the operator needs it to
            # tell a listener publishing for a backend it does not own from a missing grant.
            log.warning("nats error: %s", text.removeprefix("nats: "))
            return
        log.warning("nats error: %s", type(exc).__name__)

    async def _noop() -> None:
        return None

    options = connect_options(cfg, url=url, name=name)
    return await nats.connect(
        **options,
        error_cb=_error,
        disconnected_cb=on_disconnect or _noop,
        reconnected_cb=on_reconnect or _noop,
    )


def kv_stream_config(cfg: Bus) -> StreamConfig:
    return StreamConfig(
        name=STREAM_NAME,
        subjects=[SUBJECT_WILDCARD],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=cfg.stream.max_age,
        max_bytes=cfg.stream.max_bytes,
        discard=DiscardPolicy.OLD,
        duplicate_window=cfg.stream.duplicate_window,
        num_replicas=cfg.stream.replicas,
    )


async def ensure_kv_stream(js: JetStreamContext, cfg: Bus) -> None:
    """Create stream CONTINUUM_KV when it does not exist (see `ensure_stream`)."""
    await ensure_stream(js, kv_stream_config(cfg))


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> bool:
    """Create the stream when it does not exist (True when this call created it); leave an
    existing one as operators configured it (changing limits under a running fleet is an
    operator decision). Another process that creates it at the same moment with other limits
    wins: its stream stands."""
    assert config.name is not None
    try:
        await js.stream_info(config.name)
        return False
    except NotFoundError:
        pass
    try:
        await js.add_stream(config)
    except BadRequestError:
        # created between our look and our create; else the refusal was about our config,
        # and this raises NotFoundError
        await js.stream_info(config.name)
        return False
    log.info(
        "created stream %s (max_age=%s, max_bytes=%d)",
        config.name,
        format_duration(config.max_age or 0.0),
        config.max_bytes or -1,
    )
    return True
