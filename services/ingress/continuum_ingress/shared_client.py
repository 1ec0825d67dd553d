"""The process's shared Redis client as the components that read through it see it (the response
cache, the KV index): the current client and the swap callbacks. adapters/shared_redis.py
implements it and the composition root (app.py) builds it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # redis-py is imported only where Redis is configured
    from continuum_common.redis_client import RedisClient


class SharedClient(Protocol):
    # None when nothing is configured to use Redis.
    @property
    def client(self) -> RedisClient | None: ...

    # Called with the new client after a reload swapped it (`client` is already the new one).
    on_swap: list[Callable[[RedisClient | None], None]]
