"""Helpers shared by the response-cache end-to-end tests (tests/*/test_cache_*.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from continuum_sim import SimFleet

ADMIN_TOKEN = "cache-admin-token"
ADMIN_ENV = "CONTINUUM_TEST_CACHE_ADMIN"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def engine_requests(fleet: SimFleet) -> int:
    """Requests the simulated engines finished (their own `vllm:request_success` counters)."""
    total = 0.0
    for engine in fleet.engines:
        for family in engine.metrics.registry.collect():
            if family.name == "vllm:request_success":
                total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return int(total)


def cache_config(backends: list[dict[str, Any]], **response_cache: Any) -> dict[str, Any]:
    return {
        "backends": backends,
        "selection_strategy": "PrefixAwareHash",
        "prefix_routing": {"enabled": True},
        "response_cache": {"enabled": True, **response_cache},
        "admin": {"token_env": ADMIN_ENV},
    }


async def metric(url: str, name: str, **labels: str) -> float:
    """One sample of the ingress's /metrics (0.0 when absent)."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{url}/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


async def cache_stats(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{url}/admin/response-cache/stats", headers=ADMIN)
    response.raise_for_status()
    stats: dict[str, Any] = response.json()
    return stats


async def wait_entries(url: str, count: int, timeout: float = 5.0) -> None:
    """Entries are written after the answer went out; wait until `count` are stored."""
    async with asyncio.timeout(timeout):
        while (await cache_stats(url))["entries"] < count:
            await asyncio.sleep(0.01)
