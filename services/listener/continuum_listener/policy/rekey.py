"""TensorRT-LLM block re-keying: engine block hash → content key, for one attention-DP rank.

TensorRT-LLM's block hashes are its own (no stable, documented recipe), so the ingress cannot
recompute them from a request. The listener publishes a content key instead: each stored
block's tokens chained on its parent's content digest (protocol.blocks.content_digest, SGLang's
formula). It remembers engine hash → (digest, key, parent key, tokens, tiers) in a bounded map,
so that removals, tier moves and children stored later can be translated.

* A store whose parent is not in the map cannot be re-keyed (the parent's digest is unknown):
  the whole event is skipped (`unknown_parent`), and so, in turn, are children stored later.
* A block with fewer tokens than the full block size (`partial_block`) or with tokens that are
  not plain text ids (`unkeyed_block`) ends the chain there: it and its descendants in the
  event are skipped. The full size is the source's `block_size`, else the largest seen.
* A removal or move of a hash not in the map is counted (`unknown_block`) and skipped.
* The map holds at most `capacity` blocks; the least recently stored go first, and a block that
  goes while resident is withdrawn (published as removed): the listener can no longer translate
  its removal, and the index must never claim a block that may be gone.
* Two engine blocks can share a content key (the same tokens under another cache_salt or LoRA,
  which TensorRT-LLM hashes in and the content key cannot see): a key stays published in a tier
  until the last engine block holding it there is gone (a count per key and tier).
"""

from __future__ import annotations

from collections import OrderedDict

from continuum_common.wire.kv import TIER_GPU, TIER_STORAGE
from continuum_listener.protocol.blocks import EventBuilder, content_digest, content_key, medium_tier
from continuum_listener.protocol.model import Moved, Removed, Stored

_TIERS = (TIER_GPU, TIER_STORAGE)


class _Entry:
    __slots__ = ("digest", "key", "parent", "tiers", "tokens")

    def __init__(self, digest: bytes, key: int, parent: int | None, tokens: int) -> None:
        self.digest = digest
        self.key = key
        self.parent = parent  # the parent's content key (None at the root)
        self.tokens = tokens
        self.tiers = 0  # bit (1 << tier) per tier the block is resident in


def _count(skipped: dict[str, int], reason: str, n: int) -> None:
    if n:
        skipped[reason] = skipped.get(reason, 0) + n


class Rekeyer:
    def __init__(self, capacity: int, block_size: int | None = None) -> None:
        self.capacity = capacity
        self.configured = block_size
        self.learned = 0
        self.entries: OrderedDict[int, _Entry] = OrderedDict()
        self.refs: dict[tuple[int, int], int] = {}  # (key, tier) -> resident engine blocks
        self.pruned = 0  # entries dropped by the capacity bound (withdrawn when resident)

    def __len__(self) -> int:
        return len(self.entries)

    def _full_size(self, event: Stored) -> int:
        if self.configured is not None:
            return self.configured
        self.learned = max(self.learned, event.block_size)
        return self.learned

    def stored(self, event: Stored, out: EventBuilder, skipped: dict[str, int]) -> None:
        n = len(event.hashes)
        parent_digest: bytes | None = None
        parent_key: int | None = None
        if event.parent is not None:
            known = self.entries.get(event.parent)
            if known is None:
                _count(skipped, "unknown_parent", n)
                return
            parent_digest, parent_key = known.digest, known.key
        full = self._full_size(event)
        tier = medium_tier(event.medium)
        first_parent, keys, pos = parent_key, [], 0
        unkeyed = frozenset(event.unkeyed)
        for i, engine_hash in enumerate(event.hashes):
            span = event.spans[i]
            if i in unkeyed:
                _count(skipped, "unkeyed_block", n - i)
                break
            if span == 0 or span < full:
                _count(skipped, "partial_block", n - i)
                break
            digest = content_digest(parent_digest, event.token_ids[pos : pos + span])
            key = content_key(digest)
            self._remember(engine_hash, _Entry(digest, key, parent_key, span), tier, out)
            keys.append(key)
            parent_digest, parent_key, pos = digest, key, pos + span
        out.stored(keys, first_parent, full, tier)
        self._bound(out)

    def _remember(self, engine_hash: int, new: _Entry, tier: int, out: EventBuilder) -> None:
        entry = self.entries.get(engine_hash)
        if entry is None:
            entry = self.entries[engine_hash] = new
        else:
            self.entries.move_to_end(engine_hash)
            if entry.key != new.key:  # the engine reused a hash for other content: the old key is gone
                self._withdraw_entry(entry, out)
                entry.digest, entry.key, entry.parent, entry.tokens = new.digest, new.key, new.parent, new.tokens
        self._enter(entry, tier)

    def _enter(self, entry: _Entry, tier: int) -> None:
        bit = 1 << tier
        if not entry.tiers & bit:
            entry.tiers |= bit
            ref = (entry.key, tier)
            self.refs[ref] = self.refs.get(ref, 0) + 1

    def _leave(self, entry: _Entry, tier: int) -> bool:
        """Take the entry out of `tier`; True when no engine block holds its key there any more."""
        bit = 1 << tier
        if not entry.tiers & bit:
            return False
        entry.tiers &= ~bit
        ref = (entry.key, tier)
        left = self.refs.get(ref, 1) - 1
        if left > 0:
            self.refs[ref] = left
            return False
        self.refs.pop(ref, None)
        return True

    def removed(self, event: Removed, out: EventBuilder, skipped: dict[str, int]) -> None:
        """`medium` None (TensorRT-LLM's removal) takes the block out of every tier."""
        tiers = _TIERS if event.medium is None else (medium_tier(event.medium),)
        gone: tuple[list[int], list[int]] = ([], [])
        for engine_hash in event.hashes:
            entry = self.entries.get(engine_hash)
            if entry is None:
                _count(skipped, "unknown_block", 1)
                continue
            for tier in tiers:  # the entry stays: a late child or a repeated removal still translates
                if self._leave(entry, tier):
                    gone[tier].append(entry.key)
        for tier in _TIERS:
            out.removed(gone[tier], tier)

    def moved(self, event: Moved, out: EventBuilder, skipped: dict[str, int]) -> None:
        entry = self.entries.get(event.hash)
        if entry is None:
            _count(skipped, "unknown_block", 1)
            return
        old, new = medium_tier(event.old_medium), medium_tier(event.new_medium)
        if old == new:
            return
        self._enter(entry, new)
        out.stored([entry.key], entry.parent, entry.tokens, new)
        if self._leave(entry, old):
            out.removed([entry.key], old)

    def _withdraw_entry(self, entry: _Entry, out: EventBuilder) -> None:
        for tier in _TIERS:
            if self._leave(entry, tier):
                out.removed([entry.key], tier)

    def _bound(self, out: EventBuilder) -> None:
        while len(self.entries) > self.capacity:
            _, entry = self.entries.popitem(last=False)
            self._withdraw_entry(entry, out)
            self.pruned += 1

    def withdraw(self, out: EventBuilder) -> None:
        """The rank restarted or lost events: everything it held is gone (its removals)."""
        gone: tuple[list[int], list[int]] = ([], [])
        for key, tier in self.refs:
            gone[tier].append(key)
        for tier in _TIERS:
            out.removed(gone[tier], tier)
        self.clear()

    def restate(self, out: EventBuilder) -> None:
        """Every resident block as a store (a resync restates the state in a new epoch)."""
        for entry in self.entries.values():
            for tier in _TIERS:
                if entry.tiers & (1 << tier):
                    out.stored([entry.key], entry.parent, entry.tokens, tier)

    def clear(self) -> None:
        self.entries.clear()
        self.refs.clear()

    def take_pruned(self) -> int:
        pruned, self.pruned = self.pruned, 0
        return pruned
