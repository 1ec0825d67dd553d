"""`continuum-indexer --config router.yaml`: the KV index writer (JetStream -> Redis)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from continuum_common.config.loader import load_router_config, router_warnings
from continuum_common.errors import ConfigError
from continuum_common.logs import setup_logging
from continuum_common.runner import run, settle_heap
from continuum_indexer.app import IndexerApp
from continuum_indexer.config import DEFAULT_DURABLE, ConsumerSettings, IndexerSettings, parse_listen

log = logging.getLogger("continuum.indexer")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="continuum-indexer", description=__doc__)
    p.add_argument("--config", "-c", required=True, help="the router configuration file")
    p.add_argument("--nats-url", help="override bus.url (e.g. the embedded server of `continuum-router up`)")
    p.add_argument("--listen", default="127.0.0.1:9102", help="host:port for /healthz and /metrics, or off")
    p.add_argument("--durable", default=DEFAULT_DURABLE, help="JetStream durable consumer name (shared by replicas)")
    p.add_argument("--batch", type=int, default=500, help="messages per fetch (1-10000)")
    p.add_argument("--concurrency", type=int, default=4, help="batches applied at once (1-16)")
    p.add_argument("--max-ack-pending", type=int, default=8192, help="unacked messages in flight per consumer")
    p.add_argument("--ack-wait", type=float, default=30.0, help="seconds before an unacked message is redelivered")
    p.add_argument("--log-level", default=None)
    return p.parse_args(argv)


def build_settings(args: argparse.Namespace) -> IndexerSettings:
    config = load_router_config(args.config)
    if not config.kv_cache_index.enabled:
        raise ConfigError(f"{args.config}: kv_cache_index.enabled is false; the indexer has nothing to do")
    if config.kv_cache_index.backend != "redis":
        raise ConfigError(
            f"{args.config}: kv_cache_index.backend is memory: the in-memory index lives inside the ingress "
            "(embedded mode); run continuum-indexer only with backend: redis"
        )
    if not 1 <= args.batch <= 10_000 or args.max_ack_pending < args.batch or args.ack_wait <= 0:
        raise ConfigError("--batch must be 1-10000, --max-ack-pending >= --batch, --ack-wait > 0")
    if not 1 <= args.concurrency <= 16:
        raise ConfigError("--concurrency must be 1-16")
    try:
        listen = parse_listen(args.listen)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    consumer = ConsumerSettings(
        durable=args.durable,
        batch=args.batch,
        concurrency=args.concurrency,
        max_ack_pending=args.max_ack_pending,
        ack_wait_s=args.ack_wait,
    )
    return IndexerSettings(config=config, consumer=consumer, nats_url=args.nats_url, listen=listen)


async def serve(settings: IndexerSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    app = IndexerApp(settings)
    settle_heap()  # start-up objects out of the collector's view, young collections rarer
    await app.run(stop)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging("continuum-indexer", args.log_level)
    try:
        settings = build_settings(args)
    except ConfigError as exc:
        print(f"continuum-indexer: {exc}", file=sys.stderr)
        return 2
    for warning in router_warnings(settings.config):
        log.warning("%s", warning)
    run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
