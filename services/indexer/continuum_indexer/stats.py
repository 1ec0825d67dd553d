"""Per-source consumer state for the admin views (the seed's `event_sources` entries)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass(slots=True)
class SourceStats:
    backend_name: str
    transport: str
    connected: bool = False
    events_received: int = 0
    events_dropped: int = 0
    reconnect_count: int = 0
    last_event_at: float | None = None  # wall clock seconds

    def saw_events(self, count: int) -> None:
        self.events_received += count
        self.last_event_at = time.time()

    def to_json(self) -> dict[str, Any]:
        last = None
        if self.last_event_at is not None:
            last = datetime.fromtimestamp(self.last_event_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "backend_name": self.backend_name,
            "transport": self.transport,
            "connected": self.connected,
            "events_received": self.events_received,
            "events_dropped": self.events_dropped,
            "last_event_at": last,
            "reconnect_count": self.reconnect_count,
        }
