"""`continuum-router` (alias `continuum`): the product's command line (parsing only; each
command is handed to the module that owns it)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from continuum_common.errors import ConfigError, ContinuumError
from continuum_common.runner import frozen_imports, run


def _cmd_config_validate(args: argparse.Namespace) -> int:
    """Every file: OK (warnings on stderr) or every error with its dotted path. Exit 1 when
    any file has an error."""
    failed = 0
    for file in args.files:
        failed += _validate_one(file, args.kind)
    if len(args.files) > 1:
        print(f"{len(args.files) - failed} of {len(args.files)} file(s) valid")
    return 1 if failed else 0


def _validate_one(file: str, kind: str) -> int:
    from continuum_common.config import load_listener_config, load_router_config, read_yaml, router_warnings

    try:
        if kind == "auto":
            # The listener's file is the only one with a top-level `sources` list.
            kind = "listener" if "sources" in read_yaml(file) else "router"
        if kind == "listener":
            load_listener_config(file)
            warnings: list[str] = []
        else:
            warnings = router_warnings(load_router_config(file))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"warning: {file}: {warning}", file=sys.stderr)
    print(f"{file}: OK ({kind} configuration)")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    with frozen_imports():  # the time a restarted router is out of its load balancer
        from continuum_common.logs import setup_logging
        from continuum_ingress.config_holder import resolve_config_path
        from continuum_ingress.workers import WorkerSeat
        from continuum_router.run import serve_forever

    path = resolve_config_path(args.config)
    if path is None:
        print("error: serve needs --config FILE (or CONTINUUM_CONFIG)", file=sys.stderr)
        return 2
    seat = None
    if args.worker_dir is not None:  # started by a supervisor (server.workers > 1)
        seat = WorkerSeat(Path(args.worker_dir), args.worker_index, args.worker_count)
    setup_logging("ingress" if seat is None else f"ingress-{seat.index}", args.log_level)
    try:
        code: int = run(
            serve_forever(path, args.host, args.port, args.watch_interval, worker=seat, log_level=args.log_level)
        )
    except ContinuumError as exc:  # a bad or unreadable config, a missing secret, a port in use
        # A worker tells its supervisor on stdout, which prints it once for all workers.
        print(f"error: {exc}", file=sys.stderr if seat is None else sys.stdout, flush=True)
        return 1
    return code


def _cmd_up(args: argparse.Namespace) -> int:
    with frozen_imports():
        from continuum_common.logs import setup_logging
        from continuum_ingress.config_holder import resolve_config_path
        from continuum_router.up import up

    setup_logging("up", args.log_level)
    try:
        run(
            up(
                resolve_config_path(args.config),
                demo=args.demo,
                host=args.host,
                port=args.port,
                listener_config=args.listener_config,
                topology=args.topology,
                replicas=args.replicas,
            )
        )
    except ContinuumError as exc:  # a bad config, a missing secret, nats-server failing to start
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.rest[:1] == ["fleet"]:
        from continuum_bench.fleet import main as fleet_main

        return fleet_main(args.rest[1:])
    if args.rest[:1] == ["compare"]:
        from continuum_bench.compare import main as compare_main

        return compare_main(args.rest[1:])
    print(
        "usage: continuum-router bench fleet|compare [options]  (see `continuum-router bench fleet --help`)",
        file=sys.stderr,
    )
    return 2


DESCRIPTION = """\
Continuum: a KV-cache-aware router in front of LLM backends (vLLM, SGLang, TensorRT-LLM,
OpenAI-compatible servers, Anthropic, Gemini).

examples:
  continuum-router up --demo                       # everything on this machine, 3 simulated engines
  continuum-router serve --config router.yaml      # the router alone
  continuum-router config validate examples/*.yaml
  continuum-router bench compare --help
"""


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, summary: str, example: str
) -> argparse.ArgumentParser:
    return sub.add_parser(
        name,
        help=summary,
        description=textwrap.fill(f"{summary[0].upper()}{summary[1:]}.", 88) + f"\n\nexample:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="continuum-router", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    config = _command(
        sub, "config", "check configuration files", "continuum-router config validate router.yaml listener.yaml"
    )
    config_sub = config.add_subparsers(dest="config_command", required=True)
    validate = _command(
        config_sub,
        "validate",
        "validate router or listener configuration files (errors with their dotted path, and "
        "warnings; exit 1 when any file has an error)",
        "continuum-router config validate examples/*.yaml",
    )
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.add_argument(
        "--kind", choices=("auto", "router", "listener"), default="auto", help="which schema (default: detect)"
    )
    validate.set_defaults(func=_cmd_config_validate)

    serve = _command(
        sub,
        "serve",
        "run the router (the ingress HTTP server) with a configuration file; SIGHUP or a file change reloads it",
        "continuum-router serve --config router.yaml --port 8080",
    )
    serve.add_argument("--config", "-c", help="router configuration file (default: $CONTINUUM_CONFIG)")
    serve.add_argument("--host", help="override server.host")
    serve.add_argument("--port", type=int, help="override server.port (0 picks a free port)")
    serve.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (default: $CONTINUUM_LOG_LEVEL or INFO)")
    serve.add_argument(
        "--watch-interval",
        type=float,
        default=1.0,
        help="seconds between checks of the config file for changes (0: reload on SIGHUP only)",
    )
    # Set by the supervisor of `server.workers` > 1 for each worker it starts.
    serve.add_argument("--worker-dir", help=argparse.SUPPRESS)
    serve.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    serve.add_argument("--worker-count", type=int, default=1, help=argparse.SUPPRESS)
    serve.set_defaults(func=_cmd_serve)

    up = _command(
        sub,
        "up",
        "run the whole product on this machine: NATS, the KV listener and indexer when configured, "
        "gemini-cache when enabled, and the router (--demo adds 3 simulated engines)",
        "continuum-router up --demo",
    )
    up.add_argument("--config", "-c", help="router configuration file (optional with --demo)")
    up.add_argument("--demo", action="store_true", help="also start 3 simulated engines and route to them")
    up.add_argument("--host", help="override server.host")
    up.add_argument("--port", type=int, help="override server.port (0 picks a free port)")
    up.add_argument("--listener-config", help="also run the KV listener with this file (--demo writes its own)")
    up.add_argument(
        "--topology",
        choices=("single", "multi"),
        default="single",
        help="single: the services in this process (default); multi: each service a process of its own, "
        "a redis-server, 2 indexers and --replicas router processes, as deploy/compose runs them",
    )
    up.add_argument("--replicas", type=int, default=2, help="router processes with --topology multi (default 2)")
    up.add_argument("--log-level", default=None)
    up.set_defaults(func=_cmd_up)

    bench = _command(
        sub,
        "bench",
        "benchmarks on a simulated fleet: `bench fleet` (one router), `bench compare` (routers side by side)",
        "continuum-router bench compare --workloads shared-prompt,multi-turn",
    )
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
