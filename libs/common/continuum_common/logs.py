"""Logging set-up shared by every service: one line per record, key=value friendly.

Rule for every caller (DESIGN.md §8): never pass prompt text, token ids, API keys, salts or
response bodies to a logger. Log sizes, counts, hashes' first 12 hex characters and names.
"""

from __future__ import annotations

import logging
import os
import sys


def setup_logging(service: str, level: str | None = None) -> None:
    chosen = (level or os.environ.get("CONTINUUM_LOG_LEVEL") or "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(chosen)
    # Third-party request logs repeat what our own metrics say and may echo URLs with queries.
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def short_hash(hex_digest: str) -> str:
    """The first 12 hex characters: enough to correlate, too short to matter."""
    return hex_digest[:12]
