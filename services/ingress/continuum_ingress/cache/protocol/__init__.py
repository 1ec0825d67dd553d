"""Pure wire formats of the response cache: stored entries and SSE recording/replay (no I/O)."""
