"""What earlier `/tokenize` answers gave, remembered by what they covered (pure; used by
kv/remote_tokens.py, docs/kv-scorer.md "Remembered tokenizations").

* Chat requests: the leading messages are hashed one after the other (after the model, the
  tools, the template arguments and the cache salt), so every prefix of a message list has a
  digest (`conversation_digests`); `KnownPrefixes` maps a prefix's digest to the block hashes of
  its tokenization and finds the longest known prefix of a request lacking at most `REACH`
  trailing messages.
* Completion prompts: `KnownTexts` keys a prompt by the digest of its text and by the chained
  hashes of its text chunks (kv/chunks.py), so a prompt that extends a known one finds it, to a
  chunk.

Both are LRU stores bounded by the number of block hashes they hold (8 bytes each).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from continuum_ingress.kv.chunks import chunk_chain

REACH = 2  # how many trailing messages a known prefix may lack
TEXT_CHUNK_BYTES = 512  # the granularity to which a completion prompt finds a known one


@dataclass(frozen=True, slots=True)
class Known:
    """What one tokenization gave."""

    chain: array[int]  # wire block hashes ('Q': 8 bytes each)
    tokens: int
    # the size of what it covered (the messages' JSON, or the prompt's UTF-8), for estimates
    # of tokens per byte
    nbytes: int


def conversation_digests(
    body: Mapping[str, Any], model: str, messages: Sequence[Mapping[str, Any]]
) -> tuple[list[bytes], list[int]]:
    """One digest per leading prefix of `messages` (index i: the first i+1 messages) and each
    message's JSON size. Everything else that changes what the engine renders before the
    messages (model, tools, template arguments, cache salt) is hashed first. Fields set to null
    are left out: a message replayed as an SDK returned it (`"refusal": null`, ...) has the
    digest of the plain `{"role", "content"}` one."""
    head = orjson.dumps(
        [model, body.get("tools"), body.get("chat_template_kwargs"), body.get("cache_salt")],
        option=orjson.OPT_SORT_KEYS,
    )
    digest = hashlib.blake2b(head, digest_size=16).digest()
    digests: list[bytes] = []
    sizes: list[int] = []
    for message in messages:
        plain = message
        if None in message.values():  # `"refusal": null` and a missing field render alike
            plain = {k: v for k, v in message.items() if v is not None}
        data = orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)
        digest = hashlib.blake2b(digest + data, digest_size=16).digest()
        digests.append(digest)
        sizes.append(len(data))
    return digests, sizes


class KnownPrefixes:
    """Digest of a message prefix → what its tokenization gave; LRU, bounded by the number of
    block hashes held."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.blocks = 0
        self._known: OrderedDict[bytes, Known] = OrderedDict()

    def __len__(self) -> int:
        return len(self._known)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._known

    def find(self, digests: Sequence[bytes], reach: int = REACH) -> tuple[int, Known] | None:
        """The longest known prefix lacking at most `reach` trailing messages: (its number of
        messages, what is known of it), or None."""
        n = len(digests)
        for k in range(n, max(0, n - reach - 1), -1):
            known = self._known.get(digests[k - 1])
            if known is not None:
                self._known.move_to_end(digests[k - 1])
                return k, known
        return None

    def put(self, digest: bytes, known: Known) -> None:
        if len(known.chain) > self.max_blocks:
            return
        old = self._known.pop(digest, None)
        if old is not None:
            self.blocks -= len(old.chain)
        self._known[digest] = known
        self.blocks += len(known.chain)
        while self.blocks > self.max_blocks:
            _, evicted = self._known.popitem(last=False)
            self.blocks -= len(evicted.chain)

    def clear(self) -> None:
        self._known.clear()
        self.blocks = 0


@dataclass(slots=True)
class _TextEntry:
    known: Known
    chunks: list[int]


class KnownTexts:
    """Completion prompts: digest of the whole text → what its tokenization gave, and the
    chained hashes of its `chunk_bytes` chunks (kv/chunks.py) → that entry, so a prompt that
    extends a known one (a conversation replayed as text, turn by turn) finds it to a chunk.
    LRU, bounded by the number of block hashes held."""

    def __init__(self, max_blocks: int, chunk_bytes: int = TEXT_CHUNK_BYTES) -> None:
        self.max_blocks = max_blocks
        self.chunk_bytes = chunk_bytes
        self.blocks = 0
        self._entries: OrderedDict[bytes, _TextEntry] = OrderedDict()
        self._chunks: dict[int, bytes] = {}  # chunk chain hash -> digest of the entry holding it

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, data: bytes) -> tuple[Known, int] | None:
        """What is known of the longest known text sharing a prefix with `data`, and how many
        leading bytes they share at least (all of `data` for an exact repeat)."""
        whole = text_digest(data)
        exact = self._entries.get(whole)
        if exact is not None:
            self._entries.move_to_end(whole)
            return exact.known, len(data)
        chunks = chunk_chain(data, self.chunk_bytes)
        for j in range(len(chunks), 0, -1):
            digest = self._chunks.get(chunks[j - 1])
            entry = self._entries.get(digest) if digest is not None else None
            if entry is not None:
                self._entries.move_to_end(digest)  # type: ignore[arg-type]
                return entry.known, j * self.chunk_bytes
        return None

    def put(self, data: bytes, known: Known) -> tuple[bytes, list[int]]:
        """Remember `data`'s tokenization; returns its digest and chunk hashes (what another
        replica needs to remember it too, `put_hashed`)."""
        digest, chunks = text_digest(data), chunk_chain(data, self.chunk_bytes)
        self.put_hashed(digest, chunks, known)
        return digest, chunks

    def put_hashed(self, digest: bytes, chunks: list[int], known: Known) -> None:
        if len(known.chain) > self.max_blocks:
            return
        self._drop(digest)
        self._entries[digest] = _TextEntry(known, chunks)
        for c in chunks:
            self._chunks[c] = digest
        self.blocks += len(known.chain)
        while self.blocks > self.max_blocks:
            self._drop(next(iter(self._entries)))

    def _drop(self, digest: bytes) -> None:
        entry = self._entries.pop(digest, None)
        if entry is None:
            return
        self.blocks -= len(entry.known.chain)
        for c in entry.chunks:
            if self._chunks.get(c) == digest:  # a later entry may hold the same chunk
                del self._chunks[c]

    def clear(self) -> None:
        self._entries.clear()
        self._chunks.clear()
        self.blocks = 0


def text_digest(data: bytes) -> bytes:
    """The key of a whole completion prompt (context digest and text)."""
    return hashlib.blake2b(data, digest_size=16).digest()
