"""How load reports travel between ingress processes: the interface the transports
(adapters/load_nats.py, adapters/load_local.py) implement for the shared load view (load_share.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one publish did: messages sent, and a drop reason for each peer not reached."""

    sent: int = 0
    dropped: tuple[str, ...] = ()


class LoadTransport(Protocol):
    """Carries encoded load reports to and from the other processes."""

    name: str

    @property
    def connected(self) -> bool: ...

    async def open(self, receive: Callable[[bytes], None]) -> None:
        """Start delivering the peers' reports to `receive` (may wait for a connection)."""
        ...

    async def publish(self, payload: bytes) -> Delivery:
        """Send without waiting on a slow peer; never raises."""
        ...

    async def flush(self) -> None: ...

    async def close(self) -> None: ...
