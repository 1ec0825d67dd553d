"""Read the engines' Prometheus /metrics (vLLM names) and take before/after differences."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

WANTED = {
    "vllm:prefix_cache_queries_total": "queries",
    "vllm:prefix_cache_hits_total": "hits",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:request_success_total": "requests",
    "vllm:num_preemptions_total": "preemptions",
    # The engine's own time to first token, from its arrival: the client's TTFT minus this is
    # what the router in front added (its request path and the first chunk's way back).
    "vllm:time_to_first_token_seconds_sum": "ttft_sum",
    "vllm:time_to_first_token_seconds_count": "ttft_count",
    # The simulator's time before that clock starts (body, chat template, tokenizing): the
    # engine's own work, which routers should not be charged with.
    "continuum_sim_request_front_seconds_sum": "front_sum",
    "continuum_sim_request_front_seconds_count": "front_count",
    # From the same arrival to the first chunk handed to the engine's HTTP server (real seconds):
    # the client's TTFT minus this is the router's own path, whatever the engine process was busy with.
    "continuum_sim_first_chunk_seconds_sum": "first_chunk_sum",
    "continuum_sim_first_chunk_seconds_count": "first_chunk_count",
}


@dataclass
class EngineCounters:
    queries: float = 0.0
    hits: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests: float = 0.0
    preemptions: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    front_sum: float = 0.0
    front_count: float = 0.0
    first_chunk_sum: float = 0.0
    first_chunk_count: float = 0.0

    def minus(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(**{k: getattr(self, k) - getattr(other, k) for k in self.__dataclass_fields__})


def parse(text: str) -> EngineCounters:
    """Sum every sample of the wanted counters (over labels such as finished_reason)."""
    counters = EngineCounters()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = WANTED.get(sample.name)
            if field is not None:
                setattr(counters, field, getattr(counters, field) + sample.value)
    return counters


async def scrape_all(client: httpx.AsyncClient, urls: list[str]) -> list[EngineCounters]:
    async def one(url: str) -> EngineCounters:
        resp = await client.get(url + "/metrics", timeout=10.0)
        resp.raise_for_status()
        return parse(resp.text)

    return list(await asyncio.gather(*(one(u) for u in urls)))


async def fresh_all(client: httpx.AsyncClient, urls: list[str]) -> None:
    """POST /sim/reset on every simulated engine: as freshly started engines, their caches empty
    and their KV event history forgotten. `bench compare` does it before it starts each router,
    so a router's KV listener does not replay the runs of the routers before it (a listener
    that starts replays all the engine still buffers, up to `--buffer-steps` batches)."""
    await _post_all(client, urls, "/sim/reset")


async def reset_all(client: httpx.AsyncClient, urls: list[str]) -> None:
    """POST /reset_prefix_cache everywhere, so each run starts cold (the engines must be idle)."""
    await _post_all(client, urls, "/reset_prefix_cache")


async def _post_all(client: httpx.AsyncClient, urls: list[str], path: str) -> None:
    for url in urls:
        resp = await client.post(url + path, timeout=10.0)
        if resp.status_code != 200:
            raise RuntimeError(f"{url}: {path} answered {resp.status_code}: {resp.text[:200]}")
