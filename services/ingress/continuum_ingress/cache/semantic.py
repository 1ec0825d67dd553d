"""The semantic cache path (seed "시맨틱 캐시"), between the exact lookup and the backend.

`response_cache.semantic.enabled` alone turns it on: the seed's extra gates (control plane
`semantic_cache_enabled`, the Hub's organisation policy) do not exist in Continuum.

On an exact miss of an eligible request (policy/semantic.py) the last user turn is embedded
with one call to the configured backend; the vector is compared, inside the request's
partition only, with the vectors of earlier answers. A score ≥ `threshold` answers with the
body stored under `sem:<id>` in the response-cache store (so it shares `capacity` and, with
Redis, the shared store). On a miss the vector rides along with the request and is indexed
when the backend's answer is stored. The vector index is per process; bodies written by
another ingress are found only through this process's own index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from continuum_common.config.router import ResponseCacheConfig, SemanticCache
from continuum_ingress.cache.policy.semantic import partition_digest, semantic_entry_id, semantic_text
from continuum_ingress.cache.protocol.embeddings import EmbeddingClient
from continuum_ingress.cache.semantic_index import SemanticIndex, SemanticMatch, Vector

SEM_PREFIX = "sem:"


@dataclass(frozen=True, slots=True)
class SemanticSettings:
    threshold: float = 0.92
    ttl: float = 300.0
    max_input_bytes: int = 8192
    max_entries: int = 1000
    cache_omitted_temperature: bool = False

    @classmethod
    def from_config(cls, cache: ResponseCacheConfig) -> SemanticSettings:
        sem: SemanticCache = cache.semantic
        return cls(
            threshold=sem.threshold,
            ttl=sem.ttl if sem.ttl is not None else cache.ttl,
            max_input_bytes=sem.max_input_bytes,
            max_entries=sem.max_entries,
            cache_omitted_temperature=cache.cache_omitted_temperature,
        )


@dataclass(frozen=True, slots=True)
class SemanticTicket:
    """What a miss carries to the store step: where and under which vector to index the answer."""

    partition: str
    entry_id: str
    vector: Vector

    @property
    def store_key(self) -> str:
        return SEM_PREFIX + self.entry_id


class SemanticLayer:
    def __init__(
        self, embedder: EmbeddingClient, settings: SemanticSettings, index: SemanticIndex | None = None
    ) -> None:
        self.embedder = embedder
        self.settings = settings
        self.index = index if index is not None else SemanticIndex(settings.max_entries)
        self.lookups = 0
        self.hits = 0
        # What the embedder was built from; a reload with another signature builds a new layer.
        self.signature: tuple[object, ...] | None = None

    def configure(self, settings: SemanticSettings) -> None:
        self.settings = settings
        self.index.resize(settings.max_entries)

    async def prepare(self, body: Mapping[str, Any], *, route: str, tenant_id: str | None) -> SemanticTicket | None:
        """Eligibility, partition and embedding; None means "not on the semantic path"."""
        text = semantic_text(
            body,
            route=route,
            max_input_bytes=self.settings.max_input_bytes,
            omitted_temperature_is_zero=self.settings.cache_omitted_temperature,
        )
        if text is None:
            return None
        try:
            partition = partition_digest(body, tenant_id=tenant_id, route=route, embedding_model=self.embedder.model)
        except orjson.JSONEncodeError:  # e.g. an integer beyond 64 bits: not canonical JSON
            return None
        self.lookups += 1
        vector = await self.embedder.embed(text)
        if vector is None:
            return None
        return SemanticTicket(partition, semantic_entry_id(partition, text), vector)

    def match(self, ticket: SemanticTicket) -> SemanticMatch | None:
        return self.index.search(ticket.partition, ticket.vector, self.settings.threshold)

    def forget(self, ticket: SemanticTicket, entry_id: str) -> None:
        """The body behind an index entry is gone (expired, evicted, cleared elsewhere)."""
        self.index.remove(ticket.partition, entry_id)

    def remember(self, ticket: SemanticTicket) -> bool:
        return self.index.add(ticket.partition, ticket.entry_id, ticket.vector, self.settings.ttl)
