"""Deterministic "model output": plausible English drawn from the vocabulary's word tokens.

The same prompt (and `seed`) always yields the same tokens. Every generated sequence is the
tokenizer's own encoding of its text — words carry their leading space and punctuation never
doubles up — so a client that sends the answer back in the next turn reproduces the exact token
ids and hits the blocks the engine cached while decoding (as with a real model and tokenizer).
"""

from __future__ import annotations

import random
import zlib
from array import array
from collections.abc import Sequence

from continuum_sim.protocol.tokenizer import Tokenizer
from continuum_sim.protocol.words import GENERATION_WORDS


class TextGenerator:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._first = self._ids([w.capitalize() for w in GENERATION_WORDS])
        self._words = self._ids([" " + w for w in GENERATION_WORDS])
        self._capital = self._ids([" " + w.capitalize() for w in GENERATION_WORDS])
        period, comma = tokenizer.token_id("."), tokenizer.token_id(",")
        if period is None or comma is None:
            raise RuntimeError("vocabulary lacks '.' or ','")
        self._period, self._comma = period, comma

    def _ids(self, texts: Sequence[str]) -> list[int]:
        out: list[int] = []
        for text in texts:
            token = self.tokenizer.token_id(text)
            if token is None:
                raise RuntimeError(f"generation word {text!r} is not a single token")
            out.append(token)
        return out

    def tokens(self, count: int, rng: random.Random, *, leading_space: bool = False) -> list[int]:
        """`count` tokens of sentence-like text; starts with a capitalised word (with a leading
        space when the text will follow other text)."""
        out: list[int] = []
        since_period = 0
        choice = rng.choice
        while len(out) < count:
            if not out:
                out.append(choice(self._capital if leading_space else self._first))
            elif out[-1] == self._period:
                out.append(choice(self._capital))
            elif out[-1] == self._comma:
                out.append(choice(self._words))
            elif since_period >= 6 and rng.random() < 0.12:
                out.append(self._period)
                since_period = 0
                continue
            elif since_period >= 3 and rng.random() < 0.05:
                out.append(self._comma)
                continue
            else:
                out.append(choice(self._words))
            since_period += 1
        return out

    def answer(self, prompt_ids: Sequence[int], count: int, seed: int | None = None) -> list[int]:
        """The simulated completion of a prompt."""
        digest = zlib.crc32(array("I", prompt_ids).tobytes())
        rng = random.Random(digest if seed is None else (digest << 32) | (seed & 0xFFFFFFFF))
        return self.tokens(count, rng)

    def default_length(self, prompt_ids: Sequence[int], low: int, high: int) -> int:
        """Output length used when a request sets no max_tokens (deterministic per prompt)."""
        return low + zlib.adler32(array("I", prompt_ids[-64:]).tobytes()) % (high - low + 1)
