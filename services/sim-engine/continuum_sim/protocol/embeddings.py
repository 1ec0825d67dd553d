"""Deterministic text embeddings for testing a semantic cache.

A hashed bag of features, L2-normalised: every lower-cased word (weight 1.0) and every
character trigram of " word " (weight 0.5), each hashed with BLAKE2b to a dimension and a sign.
Texts that share most words (paraphrases, reorderings, small edits) get a high cosine
similarity; unrelated texts land near 0. `dimensions` truncates and renormalises, like
OpenAI's text-embedding-3 models.
"""

from __future__ import annotations

import base64
import hashlib
import re

import numpy as np
import numpy.typing as npt

_WORD_RE = re.compile(r"\w+")


def _slot(feature: str, dim: int) -> tuple[int, float]:
    h = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")
    return h % dim, (1.0 if (h >> 63) & 1 else -1.0)


def embed(text: str, dim: int) -> npt.NDArray[np.float32]:
    vec = np.zeros(dim, dtype=np.float64)
    for word in _WORD_RE.findall(text.lower()):
        index, sign = _slot("w:" + word, dim)
        vec[index] += sign
        padded = f" {word} "
        for i in range(len(padded) - 2):
            index, sign = _slot("c:" + padded[i : i + 3], dim)
            vec[index] += 0.5 * sign
    norm = float(np.linalg.norm(vec))
    if norm == 0.0:
        vec[0] = 1.0  # the empty text still gets a unit vector
        norm = 1.0
    return (vec / norm).astype(np.float32)


def truncate(vec: npt.NDArray[np.float32], dimensions: int | None) -> npt.NDArray[np.float32]:
    if dimensions is None or dimensions >= vec.shape[0]:
        return vec
    cut = vec[:dimensions]
    norm = float(np.linalg.norm(cut))
    return cut if norm == 0.0 else (cut / norm).astype(np.float32)


def encode_base64(vec: npt.NDArray[np.float32]) -> str:
    """OpenAI's base64 form: little-endian float32 bytes."""
    return base64.b64encode(vec.astype("<f4").tobytes()).decode()
