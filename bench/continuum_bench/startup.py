"""How long an ingress takes to start and to stop (`python -m continuum_bench.startup`).

    python -m continuum_bench.startup                        # KV precise, 5 starts
    python -m continuum_bench.startup --tokenizer            # with a local tokenizer to load
    python -m continuum_bench.startup --baseline ../old      # another checkout, alternated

A restarted ingress is out of its load balancer from SIGTERM until its `/readyz` answers 200
again, so that is what is timed: a private `nats-server -js` and a `continuum-router serve`
configured as `bench compare`'s `continuum-kv-precise` (four vLLM backends in one precise
match group, the KV index in memory fed from the bus, decisions and load shared over NATS;
the backends' URLs answer nothing, which the ingress reports and does not wait for). Per start,
in the order the operator sees them:

* `interpreter`: `python -c pass`, timed separately (what any Python process takes to start
  on this machine, part of every figure below);
* `listening`: from the process's spawn to its `listening on` line (interpreter, imports,
  configuration, components started, socket bound);
* `ready`: from the spawn to the first 200 from `GET /readyz` (asked every 5 ms);
* `stop`: from SIGTERM to the process's exit, with nothing in flight.

Medians over `--repeats`; with `--baseline`, the two checkouts alternate start by start.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from continuum_bench.bytecode import compile_packages, compile_tree
from continuum_bench.ingress_latency import _source_path
from continuum_common.procs import NatsServer, free_port

MODEL = "bench-model"
LISTENING = b"listening on "


def config(nats_url: str, tokenizer: tuple[Path, Path] | None) -> dict[str, Any]:
    group: dict[str, Any] = {
        "name": "fleet", "models": [MODEL], "mode": "precise", "engine": "vllm", "block_size": 16, "hash_seed": "0",
    }  # fmt: skip
    if tokenizer is not None:
        group["tokenizer"], group["chat_template"] = str(tokenizer[0]), str(tokenizer[1])
    return {
        "selection_strategy": "PrefixAwareHash",
        "prefix_routing": {"enabled": True},
        "bus": {"embedded": False, "url": nats_url},
        "backends": [
            {"name": f"b{i}", "url": f"http://127.0.0.1:{free_port()}", "type": "vllm", "models": [MODEL]}
            for i in range(4)
        ],
        "kv_cache_index": {"enabled": True, "backend": "memory", "groups": [group]},
    }


def interpreter_seconds(env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return time.perf_counter() - started


async def start_once(path: Path, env: dict[str, str]) -> dict[str, float]:
    port = free_port()
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "continuum_router", "serve", "--config", str(path), "--port", str(port),
        "--log-level", "WARNING", env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            while LISTENING not in (line := await proc.stdout.readline()):
                if not line:
                    raise RuntimeError("the ingress exited before it listened")
            listening = time.perf_counter() - started
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
                while (await client.get("/readyz")).status_code != 200:  # noqa: ASYNC110 - what is timed
                    await asyncio.sleep(0.005)
            ready = time.perf_counter() - started
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    stopping = time.perf_counter()
    proc.terminate()
    await asyncio.wait_for(proc.wait(), 30)
    return {"listening": listening, "ready": ready, "stop": time.perf_counter() - stopping}


def _tokenizer(workdir: Path) -> tuple[Path, Path]:
    from continuum_bench.fleet.tokens import train_hf_tokenizer

    files = train_hf_tokenizer(workdir / "tokenizer")
    return files.tokenizer, files.chat_template


async def amain(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    envs = {"this checkout": dict(os.environ)}
    compile_packages()
    if args.baseline is not None:
        envs["baseline"] = {**os.environ, "PYTHONPATH": _source_path(args.baseline.resolve())}
        compile_tree(args.baseline.resolve())
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in envs}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        tokenizer = _tokenizer(workdir) if args.tokenizer else None
        server = NatsServer(data_dir=workdir / "nats")
        await server.start()
        try:
            path = workdir / "router.yaml"
            path.write_text(yaml.safe_dump(config(server.url, tokenizer)))
            for env in envs.values():  # a first start of each warms the page cache
                await start_once(path, env)
            for _ in range(args.repeats):
                for name, env in envs.items():
                    run = await start_once(path, env)
                    run["interpreter"] = await asyncio.to_thread(interpreter_seconds, env)
                    runs[name].append(run)
        finally:
            await server.close()
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokenizer", action="store_true", help="give the match group a local tokenizer to load")
    parser.add_argument("--baseline", type=Path, help="another Continuum checkout, started in the same rounds")
    args = parser.parse_args()
    results = asyncio.run(amain(args))
    print(f"ingress start and stop, KV precise{' with a local tokenizer' if args.tokenizer else ''}; "
          f"medians of {args.repeats}")  # fmt: skip
    columns = ("interpreter", "listening", "ready", "stop")
    print(f"{'':16}" + "".join(f"{c:>13}" for c in columns))
    for name, med in results.items():
        print(f"{name:16}" + "".join(f"{med[c] * 1000:>11.0f}ms" for c in columns))


if __name__ == "__main__":
    main()
