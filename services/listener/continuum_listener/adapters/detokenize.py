"""HTTP client for an engine's `POST /detokenize` (vLLM shape, kv-events-spec §1.9):
`{"model": ..., "tokens": [...]}` → `{"prompt": "..."}`.

Every call has the source's timeout; concurrency is bounded by the pipeline's worker count.
Failures raise DetokenizeError with a reason; the response text is never logged (it is prompt
text).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import httpx
import orjson

from continuum_listener.errors import DetokenizeError

MAX_RESPONSE = 16 << 20


class DetokenizeClient:
    def __init__(
        self,
        url: str,
        *,
        model: str | None,
        timeout: float,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self.url = url
        self.model = model
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout), follow_redirects=False, trust_env=False,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )  # fmt: skip
        self._observe = observe or (lambda _seconds: None)

    async def __call__(self, tokens: Sequence[int]) -> str:
        body = orjson.dumps({"model": self.model, "tokens": list(tokens)})
        started = time.monotonic()
        try:
            async with self._client.stream(
                "POST", self.url, content=body, headers={"content-type": "application/json"}
            ) as response:
                if response.status_code != 200:
                    raise DetokenizeError(f"http_{response.status_code}")
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_RESPONSE:
                        raise DetokenizeError("too_large")
                    chunks.append(chunk)
        except httpx.TimeoutException:
            raise DetokenizeError("timeout") from None
        except httpx.HTTPError:
            raise DetokenizeError("transport") from None
        self._observe(time.monotonic() - started)
        content = b"".join(chunks)
        try:
            prompt = orjson.loads(content).get("prompt")
        except (orjson.JSONDecodeError, AttributeError):
            raise DetokenizeError("bad_body") from None
        if not isinstance(prompt, str):
            raise DetokenizeError("bad_body")
        return prompt

    async def aclose(self) -> None:
        await self._client.aclose()
