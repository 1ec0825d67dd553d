"""Deterministic "model output": plausible English drawn from a fixed word list.

The same prompt (and `seed`) always yields the same tokens. Text is built from units — a
capitalised first word, " word", " Word", ".", "," — each a fixed id sequence: one token each
with the built-in tokenizer (`TextGenerator(tokenizer)`), the tokenizer's encoding of the unit
with a Hugging Face one (`TextGenerator.from_encoder(encode)`). Words carry their leading space
and punctuation never doubles up, so the ids are the tokenizer's own encoding of the text (for
byte-level BPE every unit boundary is a pre-token boundary): a client that sends the answer back
in the next turn reproduces the exact ids and hits the blocks the engine cached while decoding,
as with a real model and tokenizer. An answer of `count` tokens is cut at `count` ids, which can
split the last word when units are several tokens long.
"""

from __future__ import annotations

import random
import zlib
from array import array
from collections.abc import Callable, Sequence

from continuum_sim.protocol.tokenizer import Tokenizer
from continuum_sim.protocol.words import GENERATION_WORDS

Unit = tuple[int, ...]


class TextGenerator:
    def __init__(self, tokenizer: Tokenizer) -> None:
        def single(text: str) -> Unit:
            token = tokenizer.token_id(text)
            if token is None:
                raise RuntimeError(f"generation unit {text!r} is not a single token")
            return (token,)

        self._set_units(single)

    @classmethod
    def from_encoder(cls, encode: Callable[[str], Sequence[int]]) -> TextGenerator:
        """A generator whose units are `encode(unit_text)` (no special tokens added)."""
        generator = cls.__new__(cls)

        def unit(text: str) -> Unit:
            ids = tuple(encode(text))
            if not ids:
                raise RuntimeError(f"generation unit {text!r} encodes to no token")
            return ids

        generator._set_units(unit)
        return generator

    def _set_units(self, unit: Callable[[str], Unit]) -> None:
        self._first = [unit(w.capitalize()) for w in GENERATION_WORDS]
        self._words = [unit(" " + w) for w in GENERATION_WORDS]
        self._capital = [unit(" " + w.capitalize()) for w in GENERATION_WORDS]
        self._period, self._comma = unit("."), unit(",")

    def tokens(self, count: int, rng: random.Random, *, leading_space: bool = False) -> list[int]:
        """`count` tokens of sentence-like text; starts with a capitalised word (with a leading
        space when the text will follow other text)."""
        out: list[int] = []
        last: Unit | None = None
        since_period = 0
        choice = rng.choice
        while len(out) < count:
            if last is None:
                unit = choice(self._capital if leading_space else self._first)
            elif last is self._period:
                unit = choice(self._capital)
            elif last is self._comma:
                unit = choice(self._words)
            elif since_period >= 6 and rng.random() < 0.12:
                last = self._period
                out += last
                since_period = 0
                continue
            elif since_period >= 3 and rng.random() < 0.05:
                last = self._comma
                out += last
                continue
            else:
                unit = choice(self._words)
            out += unit
            last = unit
            since_period += 1
        return out[:count]

    def answer(self, prompt_ids: Sequence[int], count: int, seed: int | None = None) -> list[int]:
        """The simulated completion of a prompt."""
        digest = zlib.crc32(array("I", prompt_ids).tobytes())
        rng = random.Random(digest if seed is None else (digest << 32) | (seed & 0xFFFFFFFF))
        return self.tokens(count, rng)

    def default_length(self, prompt_ids: Sequence[int], low: int, high: int) -> int:
        """Output length used when a request sets no max_tokens (deterministic per prompt)."""
        return low + zlib.adler32(array("I", prompt_ids[-64:]).tobytes()) % (high - low + 1)
