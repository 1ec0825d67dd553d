"""`continuum-gemini-cache`: Gemini cachedContents lifecycle service (docs/gemini-cache.md)."""

from __future__ import annotations

import argparse
import os
import sys

from continuum_common.config.loader import load_router_config
from continuum_common.errors import ContinuumError
from continuum_common.logs import setup_logging
from continuum_common.runner import run

DEFAULT_HTTP_PORT = 9103


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="continuum-gemini-cache",
        description="Owns every Gemini cachedContents resource; answers the ingress over NATS.",
    )
    parser.add_argument(
        "-c",
        "--config",
        default=os.environ.get("CONTINUUM_CONFIG", "config.yaml"),
        help="router configuration file (default: $CONTINUUM_CONFIG or config.yaml)",
    )
    parser.add_argument("--nats-url", help="override bus.url")
    parser.add_argument(
        "--state",
        choices=("auto", "memory", "redis"),
        default="auto",
        help="state store: redis when a redis section is configured (auto), or force one",
    )
    parser.add_argument("--http-host", default="127.0.0.1", help="address of /metrics and /healthz")
    parser.add_argument(
        "--http-port", type=int, default=DEFAULT_HTTP_PORT, help="port of /metrics and /healthz; -1 disables"
    )
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING... (default $CONTINUUM_LOG_LEVEL or INFO)")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    from continuum_gemini_cache.app import GeminiCacheApp

    cfg = load_router_config(args.config)
    app = GeminiCacheApp(
        cfg,
        source=args.config,
        nats_url=args.nats_url,
        state=args.state,
        http_host=args.http_host,
        http_port=None if args.http_port < 0 else args.http_port,
    )
    await app.serve_forever()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging("gemini-cache", args.log_level)
    try:
        run(_serve(args))
    except ContinuumError as exc:
        print(f"continuum-gemini-cache: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
