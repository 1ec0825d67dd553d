"""Token ids of pieces, assembled from a cache of word chunks (pieces.chunks: a piece cut at
every safe cut, so a chunk is roughly one word with its leading space).

Prose repeats its words, so most chunks of a new message are already cached: a lookup is one
dict probe instead of a pass through the tokenizer (whose per-token cost dominates otherwise).
The chunks that are not cached are deduplicated and tokenized in one call: those that start a
piece after a safe cut and end in a non-space character are joined (each junction is then a
safe cut again) and their ids are told apart by the tokens' character offsets; the others
(the first chunk of a span, whose ids depend on what precedes it, and chunks ending in
whitespace) are tokenized one by one. A span after an added token is tokenized as that token
followed by the span, and the token's own id is dropped, so prefix-space rules apply exactly
as in the whole text.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from continuum_common.tokenization.cache import TwoGenerationCache
from continuum_common.tokenization.errors import TokenizationError
from continuum_common.tokenization.local import LocalTokenizer
from continuum_common.tokenization.pieces import CUT, SPECIAL, START, Context, Piece, chunks


class PieceMismatch(TokenizationError):
    """The tokenizer did not behave as piecewise encoding assumes (the encoder falls back)."""


@dataclass(slots=True)
class ChunkStats:
    chunk_hits: int = 0
    chunk_misses: int = 0
    tokenizer_calls: int = 0
    tokenized_chars: int = 0
    batch_fallbacks: int = 0
    tokenize_seconds: float = 0.0


class ChunkTokenizer:
    __slots__ = ("_added", "_cache", "_tokenizer", "stats")

    def __init__(self, tokenizer: LocalTokenizer, max_cache_bytes: int, stats: ChunkStats | None = None) -> None:
        self._tokenizer = tokenizer
        self._added = tokenizer.added_tokens
        self._cache: TwoGenerationCache[Hashable, tuple[int, ...]] = TwoGenerationCache(max_cache_bytes, _chunk_size)
        self.stats = stats if stats is not None else ChunkStats()

    @property
    def cache_bytes(self) -> int:
        return self._cache.bytes

    def clear(self) -> None:
        self._cache.clear()

    def encode_pieces(self, pieces: Sequence[Piece]) -> list[list[int]]:
        """The ids of each piece (no special tokens added around the text)."""
        started = time.perf_counter()
        keys: list[Hashable] = []
        bounds: list[int] = []  # end index in `keys` of each piece's chunks
        for context, text in pieces:
            if context != SPECIAL:
                first = len(keys)
                keys += chunks(text)
                if context != CUT:
                    keys[first] = (context, keys[first])  # its ids depend on what precedes it
            bounds.append(len(keys))
        values = self._cache.get_many(keys)
        if None in values:
            values = self._fill(keys, values)
        self.stats.chunk_hits += len(keys)
        out: list[list[int]] = []
        lo = 0
        for (context, text), hi in zip(pieces, bounds, strict=True):
            if context == SPECIAL:
                out.append([self._added[text]])
            else:
                out.append(list(itertools.chain.from_iterable(values[lo:hi])))  # type: ignore[arg-type]
            lo = hi
        self.stats.tokenize_seconds += time.perf_counter() - started
        return out

    def _fill(self, keys: list[Hashable], values: list[tuple[int, ...] | None]) -> list[tuple[int, ...] | None]:
        """Tokenize the distinct chunks the cache lacks and put them in."""
        missing = list(dict.fromkeys(k for k, v in zip(keys, values, strict=True) if v is None))
        self.stats.chunk_misses += len(missing)
        self.stats.chunk_hits -= len(missing)
        fresh = self._tokenize(missing)
        for key in missing:
            self._cache.put(key, fresh[key])
        return [v if v is not None else fresh[k] for k, v in zip(keys, values, strict=True)]

    def _tokenize(self, keys: list[Hashable]) -> dict[Hashable, tuple[int, ...]]:
        out: dict[Hashable, tuple[int, ...]] = {}
        joinable: list[str] = []
        for key in keys:
            if isinstance(key, str) and not key[-1].isspace():
                joinable.append(key)
            else:
                context, text = key if isinstance(key, tuple) else (CUT, key)
                out[key] = tuple(self._encode_in_context(context, text))
        if len(joinable) == 1:
            out[joinable[0]] = tuple(self._encode_in_context(CUT, joinable[0]))
        elif joinable:
            out.update(self._encode_joined(joinable))
        return out

    def _encode_in_context(self, context: Context, text: str) -> list[int]:
        self.stats.tokenizer_calls += 1
        if context in (START, CUT):
            self.stats.tokenized_chars += len(text)
            return self._tokenizer.encode(text, add_special_tokens=False)
        assert isinstance(context, str)
        self.stats.tokenized_chars += len(context) + len(text)
        ids = self._tokenizer.encode(context + text, add_special_tokens=False)
        if not ids or ids[0] != self._added.get(context):
            raise PieceMismatch("an added token did not tokenize to its own id")
        return ids[1:]

    def _encode_joined(self, texts: list[str]) -> dict[Hashable, tuple[int, ...]]:
        """One tokenizer call for many chunks, split back by character offsets."""
        self.stats.tokenizer_calls += 1
        joined = "".join(texts)
        self.stats.tokenized_chars += len(joined)
        ids, offsets = self._tokenizer.encode_with_offsets(joined)
        bounds = list(itertools.accumulate((len(t) for t in texts), initial=0))
        per: list[list[int]] = [[] for _ in texts]
        chunk, last_start, last_chunk = 0, 0, len(texts) - 1
        for token, (start, _end) in zip(ids, offsets, strict=True):
            if start < last_start:
                return self._one_by_one(texts)  # offsets not monotonic: do not guess
            last_start = start
            while chunk < last_chunk and start >= bounds[chunk + 1]:
                chunk += 1
            per[chunk].append(token)
        if not all(per):
            return self._one_by_one(texts)
        return {text: tuple(group) for text, group in zip(texts, per, strict=True)}

    def _one_by_one(self, texts: list[str]) -> dict[Hashable, tuple[int, ...]]:
        self.stats.batch_fallbacks += 1
        return {text: tuple(self._encode_in_context(CUT, text)) for text in texts}


def _chunk_size(key: Hashable, ids: tuple[int, ...]) -> int:
    text = key if isinstance(key, str) else key[1]  # type: ignore[index]
    return sys.getsizeof(text) + 8 * len(ids) + 120  # key, tuple and dict slot, roughly
