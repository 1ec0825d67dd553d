"""HTTP client for Google's cachedContents API: create, patch (TTL), delete. One pooled httpx
client per backend; every call has a deadline; the API key travels in `x-goog-api-key` and is
never logged (nor is any body: requests carry prompts, responses may echo them)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from continuum_common.gemini_api import (
    API_VERSION,
    CachedContentInfo,
    GeminiFormatError,
    GoogleError,
    format_ttl,
    model_resource,
    parse_cached_content,
    parse_error,
)
from continuum_gemini_cache.config import GeminiBackend
from continuum_gemini_cache.metrics import Metrics

log = logging.getLogger("continuum.gemini_cache.google")


@dataclass(frozen=True, slots=True)
class ApiResult:
    """`info` on 200 (create/patch), `error` on a non-200 answer, `failure` ("timeout",
    "transport", "bad_response") when there was no usable answer."""

    status: int = 0
    info: CachedContentInfo | None = None
    error: GoogleError | None = None
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.failure is None


def create_body(model: str, system_instruction: str, ttl_seconds: float, display_name: str) -> dict[str, Any]:
    """The create request of provider-apis.md §1.3: model, systemInstruction (one text part,
    role user as the SDK sends it), ttl, and a displayName that marks router-owned caches."""
    return {
        "model": model_resource(model),
        "systemInstruction": {"parts": [{"text": system_instruction}], "role": "user"},
        "ttl": format_ttl(ttl_seconds),
        "displayName": display_name[:128],
    }


class GoogleCacheApi:
    def __init__(self, backends: Mapping[str, GeminiBackend], metrics: Metrics) -> None:
        self._backends = dict(backends)
        self._metrics = metrics
        self._clients: dict[str, httpx.AsyncClient] = {}
        for name, backend in self._backends.items():
            headers = {"content-type": "application/json"}
            if backend.api_key:
                headers["x-goog-api-key"] = backend.api_key
            self._clients[name] = httpx.AsyncClient(
                base_url=f"{backend.api_root}/{API_VERSION}/",
                headers=headers,
                timeout=httpx.Timeout(backend.request_timeout_s, connect=backend.connect_timeout_s),
                limits=httpx.Limits(max_connections=backend.max_connections, max_keepalive_connections=8),
                follow_redirects=False,
                trust_env=False,
            )

    async def _call(
        self, backend: str, op: str, method: str, path: str, timeout_s: float, **kwargs: Any
    ) -> tuple[int, Any, str | None]:
        """(status, parsed JSON body or None, failure kind)."""
        client = self._clients[backend]
        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                response = await client.request(method, path, **kwargs)
        except TimeoutError:
            return 0, None, "timeout"
        except httpx.TimeoutException:
            return 0, None, "timeout"
        except httpx.HTTPError as exc:
            log.warning("%s %s on backend %s failed: %s", method, op, backend, type(exc).__name__)
            return 0, None, "transport"
        finally:
            self._metrics.google_seconds.labels(op).observe(time.perf_counter() - started)
        try:
            body = orjson.loads(response.content) if response.content else None
        except orjson.JSONDecodeError:
            body = None
        return response.status_code, body, None

    def _result(self, status: int, body: Any, failure: str | None, *, expect_resource: bool) -> ApiResult:
        if failure is not None:
            return ApiResult(failure=failure)
        if status != 200:
            return ApiResult(status=status, error=parse_error(status, body))
        if not expect_resource:
            return ApiResult(status=200)
        try:
            return ApiResult(status=200, info=parse_cached_content(body))
        except GeminiFormatError:
            return ApiResult(status=200, failure="bad_response")

    async def create(
        self,
        backend: str,
        model: str,
        system_instruction: str,
        ttl_seconds: float,
        *,
        display_name: str,
        timeout_s: float,
    ) -> ApiResult:
        body = orjson.dumps(create_body(model, system_instruction, ttl_seconds, display_name))
        status, parsed, failure = await self._call(backend, "create", "POST", "cachedContents", timeout_s, content=body)
        return self._result(status, parsed, failure, expect_resource=True)

    async def patch_ttl(self, backend: str, name: str, ttl_seconds: float, timeout_s: float) -> ApiResult:
        body = orjson.dumps({"ttl": format_ttl(ttl_seconds)})
        status, parsed, failure = await self._call(
            backend, "patch", "PATCH", name, timeout_s, content=body, params={"updateMask": "ttl"}
        )
        return self._result(status, parsed, failure, expect_resource=True)

    async def delete(self, backend: str, name: str, timeout_s: float) -> ApiResult:
        status, parsed, failure = await self._call(backend, "delete", "DELETE", name, timeout_s)
        return self._result(status, parsed, failure, expect_resource=False)

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
