"""`continuum-kv-listener --config config.kv-listener.yaml`: engine KV events -> NATS JetStream
and SSE. Thin: parse arguments, load the configuration, run the app."""

from __future__ import annotations

import argparse
import os
import sys

from continuum_common.errors import ConfigError
from continuum_common.logs import setup_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="continuum-kv-listener", description=__doc__)
    parser.add_argument(
        "--config",
        default=os.environ.get("CONTINUUM_LISTENER_CONFIG", "config.kv-listener.yaml"),
        help="listener configuration file (default: config.kv-listener.yaml)",
    )
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING, ERROR")
    parser.add_argument(
        "--print-nats-user",
        metavar="NAME",
        help="print the nats.conf user entry for NATS user NAME that may publish only the events and "
        "heartbeats of this file's sources, and exit",
    )
    parser.add_argument(
        "--nats-password-var",
        metavar="VAR",
        help="with --print-nats-user: the environment variable nats-server reads the password from "
        "(default NATS_PASSWORD_<NAME>)",
    )
    args = parser.parse_args(argv)
    if args.print_nats_user:
        return _print_nats_user(args.config, args.print_nats_user, args.nats_password_var)
    setup_logging("kv-listener", args.log_level)

    from continuum_common.runner import frozen_imports, run

    with frozen_imports():  # a restarting listener misses the engines' events meanwhile
        from continuum_listener.app import serve
        from continuum_listener.config import load
        from continuum_listener.errors import ListenerError

    try:
        settings = load(args.config)
    except ConfigError as exc:
        print(f"continuum-kv-listener: {exc}", file=sys.stderr)
        return 1
    try:
        run(serve(settings))
    except ListenerError as exc:  # e.g. the listen address or a ZMQ bind endpoint is taken
        print(f"continuum-kv-listener: {exc}", file=sys.stderr)
        return 1
    return 0


def _print_nats_user(path: str, user: str, password_var: str | None) -> int:
    from continuum_common.config.loader import load_listener_config
    from continuum_listener.nats_permissions import nats_user_entry

    try:
        # The schema only: secrets need not be readable on the machine that writes nats.conf.
        config = load_listener_config(path)
        print(nats_user_entry(config, user, password_var=password_var), end="")
    except (ConfigError, ValueError) as exc:
        print(f"continuum-kv-listener: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
