"""The semantic cache's embedding client: one `POST /v1/embeddings` to the configured backend
per eligible request, bounded by `embedding_timeout_ms`. Any failure (timeout, connection,
non-200, malformed body) returns None, which the cache serves as a plain miss, and is counted.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import orjson

from continuum_ingress.cache.metrics import CacheMetrics
from continuum_ingress.cache.protocol.embeddings import EmbeddingFormatError, embedding_request, parse_embedding
from continuum_ingress.cache.semantic_index import Vector

log = logging.getLogger(__name__)


def embeddings_url(backend_url: str) -> str:
    """Backend URLs name the server root (`http://vllm:8000`); one ending in `/v1` is accepted too."""
    base = backend_url.rstrip("/")
    return base + ("/embeddings" if base.endswith("/v1") else "/v1/embeddings")


class HttpEmbeddingClient:
    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        backend_url: str,
        model: str,
        timeout_ms: int,
        api_key: str | None = None,
        metrics: CacheMetrics | None = None,
    ) -> None:
        self._client = client
        self.url = embeddings_url(backend_url)
        self.model = model
        self.timeout_s = timeout_ms / 1000
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._metrics = metrics
        self.failures = {"timeout": 0, "error": 0}

    def _failed(self, reason: str, detail: str) -> None:
        self.failures[reason] += 1
        if self._metrics is not None:
            self._metrics.embedding_failures.labels(reason=reason).inc()
        log.warning("semantic cache: embedding call failed (%s: %s); serving as a miss", reason, detail)

    async def embed(self, text: str) -> Vector | None:
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self._client.post(
                    self.url,
                    content=orjson.dumps(embedding_request(self.model, text)),
                    headers={"content-type": "application/json", **self._headers},
                    timeout=self.timeout_s,
                )
                if response.status_code != 200:
                    self._failed("error", f"HTTP {response.status_code}")
                    return None
                return parse_embedding(orjson.loads(response.content))
        except (TimeoutError, httpx.TimeoutException):
            self._failed("timeout", f"no answer within {self.timeout_s:g}s")
        except httpx.HTTPError as exc:
            self._failed("error", type(exc).__name__)
        except (orjson.JSONDecodeError, EmbeddingFormatError) as exc:
            self._failed("error", str(exc) if isinstance(exc, EmbeddingFormatError) else "response is not JSON")
        return None
