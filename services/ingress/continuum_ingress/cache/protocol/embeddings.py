"""The OpenAI embeddings wire format (provider-apis.md §3.5), as far as the semantic cache
needs it: one request body, and the first vector of a response in either encoding
(`encoding_format: float` gives a JSON number list; `base64` gives little-endian float32
bytes, which is what the OpenAI SDK asks for by default and some servers send regardless)."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Protocol

import numpy as np

from continuum_ingress.cache.errors import CacheError
from continuum_ingress.cache.semantic_index import Vector


class EmbeddingClient(Protocol):
    """What the semantic cache needs from an embedding backend (adapters/embeddings.py)."""

    model: str

    async def embed(self, text: str) -> Vector | None:
        """The embedding of `text`, or None on any failure or timeout (never raises)."""
        ...


class EmbeddingFormatError(CacheError):
    """The embeddings response is not the OpenAI shape."""


def embedding_request(model: str, text: str) -> dict[str, Any]:
    return {"model": model, "input": text, "encoding_format": "float"}


def parse_embedding(doc: object) -> Vector:
    if not isinstance(doc, dict):
        raise EmbeddingFormatError("response is not an object")
    data = doc.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise EmbeddingFormatError("response has no data[0]")
    raw = data[0].get("embedding")
    if isinstance(raw, str):
        try:
            blob = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise EmbeddingFormatError("embedding is not valid base64") from None
        if not blob or len(blob) % 4:
            raise EmbeddingFormatError("base64 embedding is not a float32 array")
        return np.frombuffer(blob, dtype="<f4").astype(np.float32)
    if isinstance(raw, list) and raw and all(type(x) in (int, float) for x in raw):
        return np.asarray(raw, dtype=np.float32)
    raise EmbeddingFormatError("embedding is neither a number list nor base64")
