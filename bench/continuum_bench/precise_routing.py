"""What precise KV matching adds to a request's latency through the ingress
(`python -m continuum_bench.precise_routing`).

Growing multi-turn conversations (a ~2,000-token system prompt shared by all, then user and
assistant turns of ~300 tokens each, up to ~12,000 tokens) are sent, one request at a time, to
an ingress in front of a canned ~20 µs backend, twice:

* `baseline`: PrefixAwareHash with prefix routing, no KV index;
* `precise`: the same plus Tier 4 with one precise match group whose local tokenizer is a real
  byte-level BPE (trained here, nothing downloaded) and vLLM hashing, the embedded block index
  fed over a private nats-server.

Each conversation's turns arrive in order, so the precise ingress's tokenization cache is warm
for everything but the new turn, as in production. The figure of interest is the p50 latency
difference on requests of 10,000 tokens or more (target: ≤ 2 ms added). The runs alternate
baseline / precise `--repeats` times; medians are reported. The precise ingress's own
measurement of request → block hashes (`continuum_kv_request_keys_seconds`) is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from continuum_common.procs import NatsServer, free_port
from continuum_sim.hf_tokenizer import train_tokenizer
from continuum_sim.protocol.generation import TextGenerator
from continuum_sim.protocol.tokenizer import Tokenizer

MODEL = "bench-model"
LONG = 10_000  # tokens: the requests the target is about


def conversations(count: int, seed: int) -> list[list[dict[str, Any]]]:
    """`count` conversations as the list of request bodies of each, turn by turn."""
    builtin = Tokenizer()
    gen = TextGenerator(builtin)

    def text(tokens: int, rng: random.Random) -> str:
        return builtin.decode(gen.tokens(tokens, rng))

    system = text(2000, random.Random(f"system-{seed}"))
    out = []
    for c in range(count):
        rng = random.Random(f"conv-{seed}-{c}")
        messages: list[dict[str, str]] = [{"role": "system", "content": system}]
        bodies = []
        tokens = 2000
        while tokens < 12_300:
            messages.append({"role": "user", "content": text(300, rng)})
            bodies.append({"model": MODEL, "messages": list(messages), "max_tokens": 16, "temperature": 0.7})
            messages.append({"role": "assistant", "content": text(300, rng)})
            tokens += 600
        out.append(bodies)
    return out


def config(backend_port: int, precise: bool, tokenizer: Any, nats_url: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{backend_port}"
    data: dict[str, Any] = {
        "selection_strategy": "PrefixAwareHash",
        "prefix_routing": {"enabled": True},
        "backends": [
            {"name": f"b{i}", "url": url, "type": "vllm", "models": [MODEL], "health_check_interval_ms": 5000}
            for i in range(3)
        ],
    }
    if precise:
        data["bus"] = {"embedded": False, "url": nats_url}
        data["kv_cache_index"] = {
            "enabled": True,
            "backend": "memory",
            "groups": [
                {
                    "name": "fleet",
                    "models": [MODEL],
                    "mode": "precise",
                    "engine": "vllm",
                    "block_size": 16,
                    "hash_seed": "0",
                    "tokenizer": str(tokenizer.tokenizer),
                    "chat_template": str(tokenizer.chat_template),
                }
            ],
        }
    return data


async def drive(port: int, convs: list[list[dict[str, Any]]], sizes: list[list[int]]) -> list[tuple[int, float]]:
    """Send every turn of every conversation, interleaved (turn 1 of all, then turn 2, ...);
    returns (prompt tokens, seconds) per request."""
    out: list[tuple[int, float]] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        for turn in range(max(len(c) for c in convs)):
            for conv, size in zip(convs, sizes, strict=True):
                if turn >= len(conv):
                    continue
                started = time.perf_counter()
                r = await client.post("/v1/chat/completions", json=conv[turn])
                elapsed = time.perf_counter() - started
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
                out.append((size[turn], elapsed))
    return out


async def _port_open(port: int) -> None:
    async with asyncio.timeout(30):
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.05)


def keys_seconds(port: int) -> tuple[float, float, float]:
    """(seconds spent on request -> keys, requests, seconds in the whole selector)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        for name in (
            'continuum_kv_request_keys_seconds_sum{mode="precise"}',
            'continuum_kv_request_keys_seconds_count{mode="precise"}',
            "continuum_kv_selection_seconds_sum",
        ):
            if line.startswith(name + " "):
                values[name] = float(line.split()[-1])
    return (
        values.get('continuum_kv_request_keys_seconds_sum{mode="precise"}', 0.0),
        values.get('continuum_kv_request_keys_seconds_count{mode="precise"}', 0.0),
        values.get("continuum_kv_selection_seconds_sum", 0.0),
    )


async def run_once(precise: bool, args: argparse.Namespace, workdir: Path, env: dict[str, str], nats_url: str,
             tokenizer: Any, convs: list[list[dict[str, Any]]], sizes: list[list[int]]) -> dict[str, float]:  # fmt: skip
    backend_port, ingress_port = free_port(), free_port()
    path = workdir / f"config-{'precise' if precise else 'baseline'}.yaml"
    path.write_text(yaml.safe_dump(config(backend_port, precise, tokenizer, nats_url)))
    backend = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "continuum_bench.ingress_latency", "backend", str(backend_port), env=env
    )
    ingress = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "continuum_router", "serve", "--config", str(path), "--port", str(ingress_port),
        env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await _port_open(backend_port)
        await _port_open(ingress_port)
        await asyncio.sleep(1.0)  # the KV component connects to NATS in the background
        results = await drive(ingress_port, convs, sizes)
        spent, calls, selecting = await asyncio.to_thread(keys_seconds, ingress_port) if precise else (0.0, 0.0, 0.0)
    finally:
        for proc in (ingress, backend):
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 10)
    long = sorted(s for tokens, s in results if tokens >= LONG)
    every = sorted(s for _, s in results)
    return {
        "requests": len(results),
        "long_requests": len(long),
        "p50_long_ms": statistics.median(long) * 1000,
        "p99_long_ms": long[max(0, int(len(long) * 0.99) - 1)] * 1000,
        "p50_all_ms": statistics.median(every) * 1000,
        "keys_mean_ms": spent / calls * 1000 if calls else 0.0,
        "selection_mean_ms": selecting / calls * 1000 if calls else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    asyncio.run(amain(parser.parse_args()))


async def amain(args: argparse.Namespace) -> None:
    env = {**os.environ, "CONTINUUM_LOG_LEVEL": "WARNING"}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        tokenizer = train_tokenizer(workdir / "tokenizer", vocab_size=8192)
        from continuum_common.tokenization import LocalTokenizer

        local = LocalTokenizer(tokenizer.tokenizer, chat_template=tokenizer.chat_template)
        convs = conversations(args.conversations, args.seed)
        sizes = [
            [len(local.encode(local.render_chat(b["messages"]), add_special_tokens=False)) for b in conv]
            for conv in convs
        ]
        nats = NatsServer(data_dir=workdir / "nats")
        await nats.start()
        try:
            runs: dict[str, list[dict[str, float]]] = {"baseline": [], "precise": []}
            for _ in range(args.repeats):
                for name in ("baseline", "precise"):
                    run = await run_once(name == "precise", args, workdir, env, nats.url, tokenizer, convs, sizes)
                    runs[name].append(run)
        finally:
            await nats.close()
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    b, p = med["baseline"], med["precise"]
    print(json.dumps({"runs": runs}, indent=1), file=sys.stderr)
    print(f"requests per run: {int(b['requests'])} ({int(b['long_requests'])} of >= {LONG} tokens)")
    print(f"{'':>9} | {'p50 >=10k':>10} {'p99 >=10k':>10} | {'p50 all':>8}")
    for name, m in med.items():
        print(f"{name:>9} | {m['p50_long_ms']:>8.3f}ms {m['p99_long_ms']:>8.3f}ms | {m['p50_all_ms']:>6.3f}ms")
    print(
        f"added by precise matching on >= {LONG}-token requests: p50 {p['p50_long_ms'] - b['p50_long_ms']:.3f} ms, "
        f"p99 {p['p99_long_ms'] - b['p99_long_ms']:.3f} ms; the ingress's own request -> block hashes: "
        f"{p['keys_mean_ms']:.3f} ms mean, the whole selector {p['selection_mean_ms']:.3f} ms mean"
        " (target: <= 2 ms added p50)"
    )


if __name__ == "__main__":
    main()
