"""Peer routers from PyPI for `continuum-router bench compare --plugin continuum_bench.peers`.

Importing this package registers:

| name | what runs |
|---|---|
| `vllm-router-cache-aware` | `vllm-router --policy cache_aware` (PyPI `vllm-router`) |
| `vllm-router-kv-aware` | `vllm-router --policy kv_aware`, subscribed to every engine's ZMQ KV events |
| `smg-cache-aware` | `smg launch --policy cache_aware` (PyPI `smg`, the SGLang model gateway) |
| `smg-cache-aware-beside-kv` | the same, with Continuum's KV event pipeline running unused beside it (a diagnostic) |

Install them with `pip install 'continuum-router[peers]'`. How each is configured and what its
policy does: docs/peer-routers.md.
"""

from continuum_bench.peers import smg, vllm_router

__all__ = ["smg", "vllm_router"]
