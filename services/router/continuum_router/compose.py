"""The ingress as the launcher composes it: with the KV index feed of `kv_cache_index.backend:
memory` (the indexer's consumer code, run inside the ingress process), which the ingress itself
does not import (it only knows the interface, continuum_ingress.kv.embedded).

`serve`, `up` and the test harness build the ingress here, so every way of running it routes
with the same parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from continuum_common.config import RouterConfig
from continuum_indexer.embedded import EmbeddedKvIndex
from continuum_ingress.app import IngressApp


def build_ingress(config: str | Path | RouterConfig, **kwargs: Any) -> IngressApp:
    """IngressApp for `config` (keyword seams as IngressApp's), with the embedded KV index."""
    kwargs.setdefault("embedded_index", EmbeddedKvIndex)
    return IngressApp(config, **kwargs)
