"""Engines and configuration for `continuum-router up --demo`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

DEMO_MODEL = "demo-model"
DEMO_ENGINES = 3


@dataclass(frozen=True)
class DemoEngine:
    name: str
    url: str


@contextlib.asynccontextmanager
async def demo_engines(count: int = DEMO_ENGINES) -> AsyncIterator[list[DemoEngine]]:
    """Start `count` engines on free loopback ports (in this process, on this event loop)."""
    from continuum_ingress.testing.upstream import running_stubs

    names = [f"demo-{i + 1}" for i in range(count)]
    async with running_stubs(*names) as stubs:
        yield [DemoEngine(s.name, s.url) for s in stubs]


def demo_config(engines: list[DemoEngine], *, host: str, port: int) -> dict[str, Any]:
    """Tier 1 on: the engines share a model, PrefixAwareHash keeps a system prompt on one."""
    return {
        "server": {"host": host, "port": port},
        "selection_strategy": "PrefixAwareHash",
        "prefix_routing": {"enabled": True},
        "backends": [
            {"name": e.name, "url": e.url, "type": "vllm", "models": [DEMO_MODEL], "health_check_interval_ms": 2000}
            for e in engines
        ],
    }


def banner(url: str, *, demo: bool, engines: int, services: list[str]) -> str:
    lines = [f"Continuum is up on {url}  (services: {', '.join(services)})"]
    if demo:
        body = (
            '{"model":"' + DEMO_MODEL + '","messages":[{"role":"system","content":"You are terse."},'
            '{"role":"user","content":"Hello!"}]}'
        )
        lines += [
            f"{engines} simulated engines serve the model '{DEMO_MODEL}'.",
            "",
            "Try it with curl:",
            f"  curl -s {url}/v1/chat/completions -H 'content-type: application/json' -d '{body}'",
            "",
            "Or with the OpenAI SDK (pip install openai):",
            "  from openai import OpenAI",
            f'  client = OpenAI(base_url="{url}/v1", api_key="unused")',
            f'  reply = client.chat.completions.create(model="{DEMO_MODEL}", '
            'messages=[{"role": "user", "content": "Hello!"}])',
            "  print(reply.choices[0].message.content)",
        ]
    lines += ["", f"Metrics: {url}/metrics   Models: {url}/v1/models   Ctrl-C stops everything."]
    return "\n".join(lines)
