"""Engines and configuration for `continuum-router up --demo`: a fleet of simulated vLLM engines
(`continuum_sim.SimFleet`, in a child process of its own) and a config that routes to them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from continuum_sim import SimFleet

DEMO_ENGINES = 3


@contextlib.asynccontextmanager
async def demo_fleet(count: int = DEMO_ENGINES) -> AsyncIterator[SimFleet]:
    """`count` simulated engines on free loopback ports (HTTP + vLLM-format KV events on ZMQ),
    in one child process so they do not share the ingress's event loop and core. Real-time
    timings (an 8B model on one H100), so answers take a realistic few hundred milliseconds."""
    async with SimFleet(count, name_prefix="demo", process=True) as fleet:
        yield fleet


def demo_model(fleet: SimFleet) -> str:
    model: str = fleet.endpoints[0].model
    return model


def demo_config(backends: Sequence[dict[str, Any]], *, host: str, port: int) -> dict[str, Any]:
    """Tier 1 on: the engines share a model, PrefixAwareHash keeps a system prompt on one."""
    return {
        "server": {"host": host, "port": port},
        "selection_strategy": "PrefixAwareHash",
        "prefix_routing": {"enabled": True},
        "backends": [{**b, "health_check_interval_ms": 2000} for b in backends],
    }


def banner(
    url: str, *, model: str | None, engines: int, services: list[str], admin_token_file: str | None = None
) -> str:
    lines = [f"Continuum is up on {url}  (services: {', '.join(services)})"]
    if model is not None:
        opening = '{"role":"system","content":"You are terse."},{"role":"user","content":"Hello!"}'
        first = '{"model":"' + model + '","messages":[' + opening + "]}"
        # Any answer text will do: the engine holds the blocks of the first turn's prompt.
        turn = '{"role":"assistant","content":"Hi."},{"role":"user","content":"And then?"}'
        second = '{"model":"' + model + '","messages":[' + opening + "," + turn + "]}"
        lines += [
            f"{engines} simulated vLLM engines serve the model '{model}'.",
            "",
            "Try it with curl: a conversation's first turn, then its next one. The next turn goes to the",
            "engine whose KV cache holds the longest part of its prompt (the first time: the one that",
            "answered the first turn; see the x-continuum-backend header) and reports the cached part",
            "(usage.prompt_tokens_details.cached_tokens); new conversations are spread.",
            f"  curl -si {url}/v1/chat/completions -H 'content-type: application/json' -d '{first}'",
            f"  curl -si {url}/v1/chat/completions -H 'content-type: application/json' -d '{second}'",
            "",
            "Or with the OpenAI SDK (pip install openai):",
            "  from openai import OpenAI",
            f'  client = OpenAI(base_url="{url}/v1", api_key="unused")',
            f'  reply = client.chat.completions.create(model="{model}", '
            'messages=[{"role": "user", "content": "Hello!"}])',
            "  print(reply.choices[0].message.content)",
            "  # the Responses API, routed the same way (by the prompt the engine templates):",
            f'  answer = client.responses.create(model="{model}", instructions="You are terse.", input="Hello!")',
            "  print(answer.output_text)",
            "  # a next turn that continues the stored response goes to the engine that stored it:",
            f'  later = client.responses.create(model="{model}", input="And then?", previous_response_id=answer.id)',
        ]
    if admin_token_file is not None:
        lines += [
            "",
            "Which engine holds which prompt (the KV index):",
            f'  curl -s {url}/admin/kv-index/stats -H "Authorization: Bearer $(cat {admin_token_file})"',
        ]
    lines += ["", f"Metrics: {url}/metrics   Models: {url}/v1/models   Ctrl-C stops everything."]
    return "\n".join(lines)
