"""The bounded block-chain tracker of one engine source (seed "블록 체인 추적 및 메모리 한도").

Per block it stores only what the seed allows: its parent reference, its chain depth, and —
only while the block might still be needed to rebuild a prompt for /detokenize — its own token
segment as 4-byte ids. Each block is in one of four states:

* ATTRIBUTED: the chain's prefix key is known (a verified salt, an attributed parent, or a
  detokenize answer); the block contributes its depth to the DepthBook. Tokens are dropped: a
  descendant inherits the key from its parent without them.
* OPEN: not attributable yet (the tokens so far do not determine the anchor text); tokens kept
  for a deeper chain's rebuild. Prompt heads shared by several system prompts stay OPEN.
* PENDING: a detokenize job for this block is in flight.
* DEAD: can never be attributed (salt missing or forged on a salt-only source, parent never seen,
  tokens unusable, chain longer than max_chain_tokens, no anchor in the prompt). Kept so its
  descendants are classified without work; never contributes.

Limits: `max_tracked_blocks` and `max_retained_tokens` prune the oldest individual entries
(blocks, or only their tokens); a pruned block withdraws its contribution, so only prefixes whose
last block was pruned disappear — never a full reset. Retained tokens per source therefore stay
≤ min(max_retained_tokens, max_tracked_blocks × max_chain_tokens).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Literal

from continuum_common.events import Tier
from continuum_common.salt import verify_salt
from continuum_listener.policy.depths import GPU, STORAGE, DepthBook
from continuum_listener.protocol.model import GPU_MEDIA, Moved, Removed, Stored, medium_tier

Mode = Literal["salt_echo", "detokenize", "auto"]
_GPU_BIT = 1
_MAX_MEDIUM_BITS = 30


class State(IntEnum):
    ATTRIBUTED = 0
    OPEN = 1
    PENDING = 2
    DEAD = 3


class Block:
    __slots__ = ("depth", "job", "media", "parent", "prefix", "state", "tokens")

    def __init__(self, parent: int | None, depth: int, media: int) -> None:
        self.parent = parent
        self.depth = depth
        self.media = media
        self.state = State.OPEN
        self.prefix: bytes | None = None
        self.tokens: array[int] | None = None
        self.job = 0


@dataclass(frozen=True, slots=True)
class Limits:
    max_chain_tokens: int = 16_384
    max_tracked_blocks: int = 100_000
    max_retained_tokens: int = 16_777_216


@dataclass(slots=True)
class Job:
    """Detokenize the chain root → `run[-1]`; the answer attributes `run[i:]`.

    `tokens` is filled by `ChainTracker.materialize` only when a worker starts the job, so queued
    jobs hold no token copies (memory stays within the retained-token limit plus one chain per
    detokenize worker)."""

    id: int
    generation: int
    run: list[int]
    depths: list[int]
    model: str | None  # LoRA adapter name overriding the source model for the key
    tokens: array[int] | None = None
    waiters: list[list[int]] = field(default_factory=list)


class Outcome(IntEnum):
    DETERMINED = 0
    PENDING = 1  # the whole chain is still short of the anchor
    FAILED = 2  # transient (HTTP error, timeout, queue full): blocks stay OPEN for a retry
    UNATTRIBUTABLE = 3  # never (no anchor, template mismatch, ambiguous)


@dataclass(frozen=True, slots=True)
class Resolution:
    outcome: Outcome
    index: int = 0  # first determined position in the job's run
    prefix: bytes | None = None


class ChainTracker:
    def __init__(
        self,
        *,
        backend: str,
        book: DepthBook,
        mode: Mode = "auto",
        secret: bytes | None = None,
        detokenize: bool = False,
        limits: Limits = Limits(),
    ) -> None:
        self.backend = backend
        self.book = book
        self.limits = limits
        self._secret = secret
        self._use_salt = mode != "detokenize" and secret is not None
        self._salt_required = mode == "salt_echo"
        self._detokenize = detokenize and mode != "salt_echo"
        self.blocks: OrderedDict[int, Block] = OrderedDict()
        self._token_blocks: OrderedDict[int, None] = OrderedDict()
        self.retained_tokens = 0
        self.generation = 0
        self._jobs: dict[int, Job] = {}
        self._next_job = 1
        self._media: dict[str, int] = {name: _GPU_BIT for name in GPU_MEDIA}
        self._salt_cache: dict[str, bytes | None] = {}
        self.counts: dict[str, int] = {}

    # -- bookkeeping -------------------------------------------------------------------------

    def _count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def drain_counts(self) -> dict[str, int]:
        counts, self.counts = self.counts, {}
        return counts

    def _bit(self, medium: str | None) -> int:
        """One bit per medium name; every GPU name shares bit 0 (the gpu_hot tier)."""
        if medium is None:
            return _GPU_BIT
        bit = self._media.get(medium)
        if bit is None:
            if medium_tier(medium) is Tier.GPU_HOT:
                self._media[medium] = _GPU_BIT
                return _GPU_BIT
            used = len(set(self._media.values()))
            bit = 1 << min(used, _MAX_MEDIUM_BITS)
            self._media[medium] = bit
        return bit

    def _contribute(self, block: Block, media: int, sign: int) -> None:
        prefix = block.prefix
        if prefix is None:
            return
        op = self.book.add if sign > 0 else self.book.remove
        if media & _GPU_BIT:
            op(GPU, prefix, block.depth)
        if media & ~_GPU_BIT:
            op(STORAGE, prefix, block.depth)

    def _set_media(self, block: Block, media: int) -> None:
        old = block.media
        if old == media:
            return
        block.media = media
        if block.state is State.ATTRIBUTED:
            gained, lost = _tiers(media) & ~_tiers(old), _tiers(old) & ~_tiers(media)
            self._contribute(block, gained, 1)
            self._contribute(block, lost, -1)

    def _drop_tokens(self, key: int, block: Block) -> None:
        if block.tokens is not None:
            self.retained_tokens -= len(block.tokens)
            block.tokens = None
            self._token_blocks.pop(key, None)

    def _forget(self, key: int, block: Block) -> None:
        """`block` (already out of `blocks`) leaves: withdraw its depth, free its tokens."""
        if block.state is State.ATTRIBUTED:
            self._contribute(block, block.media, -1)
        self._drop_tokens(key, block)

    def _attribute(self, key: int, block: Block, prefix: bytes) -> None:
        block.state = State.ATTRIBUTED
        block.prefix = prefix
        block.job = 0
        self._drop_tokens(key, block)
        self._contribute(block, block.media, 1)

    def _kill(self, key: int, block: Block) -> None:
        block.state = State.DEAD
        block.job = 0
        self._drop_tokens(key, block)

    def _verify(self, salt: str) -> bytes | None:
        cache = self._salt_cache
        if salt in cache:
            return cache[salt]
        assert self._secret is not None
        prefix = verify_salt(self._secret, self.backend, salt)
        if len(cache) >= 4096:
            cache.clear()
        cache[salt] = prefix
        return prefix

    # -- engine events -----------------------------------------------------------------------

    def apply_stored(self, event: Stored) -> list[Job]:
        """Add `event`'s blocks; returns the detokenize jobs to run (already registered)."""
        if event.placeholder:
            self._placeholder(event)
            return []
        blocks = self.blocks
        bit = self._bit(event.medium)
        parent_key = event.parent
        parent = blocks.get(parent_key) if parent_key is not None else None
        if parent_key is not None and parent is None:
            self._count("orphan")
        salts = event.salts if self._use_salt else None
        jobs: list[Job] = []
        run: list[int] = []
        pos = 0
        for i, key in enumerate(event.hashes):
            span = event.spans[i]
            block = blocks.get(key)
            if block is not None:  # an idempotent re-store, possibly into another medium
                blocks.move_to_end(key)
                self._set_media(block, block.media | bit)
                self._finish_run(run, event, jobs)
                run = []
            else:
                block = Block(parent_key, (parent.depth if parent is not None else 0) + span, bit)
                blocks[key] = block
                salt = salts[i] if salts is not None and i < len(salts) else None
                self._classify(key, block, parent, parent_key, salt)
                if block.state is State.OPEN and not self._keep_tokens(key, block, event, pos, span):
                    block.state = State.DEAD
                if block.state is State.OPEN:
                    run.append(key)
                elif run:
                    self._finish_run(run, event, jobs)
                    run = []
            parent, parent_key = block, key
            pos += span
        self._finish_run(run, event, jobs)
        self._enforce_limits()
        return jobs

    def _classify(self, key: int, block: Block, parent: Block | None, parent_key: int | None, salt: str | None) -> None:
        if salt is not None:
            prefix = self._verify(salt)
            if prefix is None:
                self._count("salt_invalid")
                block.state = State.DEAD
            else:
                self._attribute(key, block, prefix)
        elif parent is None:
            if parent_key is not None:
                block.state = State.DEAD  # orphan: the chain's start was never seen
            elif self._salt_required:
                self._count("salt_missing")
                block.state = State.DEAD
            elif not self._detokenize:
                self._count("no_method")
                block.state = State.DEAD
        elif parent.state is State.ATTRIBUTED:
            assert parent.prefix is not None
            self._attribute(key, block, parent.prefix)
        elif parent.state is State.DEAD:
            block.state = State.DEAD
        # else: OPEN (the default), waiting for the anchor

    def _keep_tokens(self, key: int, block: Block, event: Stored, pos: int, span: int) -> bool:
        """Store the block's own token segment (4-byte ids); False when it cannot be kept."""
        if not event.tokens_ok or span == 0:
            self._count("no_tokens")
            return False
        if block.depth > self.limits.max_chain_tokens:
            self._count("chain_too_long")
            return False
        segment = event.token_ids[pos : pos + span]
        try:
            tokens = array("I", segment)
        except (TypeError, OverflowError):
            try:  # EAGLE bigram pairs (SGLang): the first element is the token at that position
                tokens = array("I", [pair[0] for pair in segment])
            except (TypeError, OverflowError, IndexError, KeyError):
                self._count("bad_tokens")
                return False
        block.tokens = tokens
        self._token_blocks[key] = None
        self.retained_tokens += len(tokens)
        return True

    def _finish_run(self, run: list[int], event: Stored, jobs: list[Job]) -> None:
        if not run:
            return
        first = self.blocks[run[0]]
        parent = self.blocks.get(first.parent) if first.parent is not None else None
        if parent is not None and parent.state is State.PENDING and parent.job in self._jobs:
            waiting = self._jobs[parent.job]
            waiting.waiters.append(list(run))
            for key in run:
                self.blocks[key].state = State.PENDING
                self.blocks[key].job = waiting.id
            return
        job = self._make_job(list(run), event.lora_name)
        if job is not None:
            jobs.append(job)

    def _segments(self, key: int) -> list[array[int]] | None:
        """Token segments from `key` back to the chain root, or None when one is missing."""
        segments: list[array[int]] = []
        block: Block | None = self.blocks.get(key)
        while block is not None:
            if block.tokens is None:
                return None
            segments.append(block.tokens)
            if block.parent is None:
                return segments
            block = self.blocks.get(block.parent)
        return None

    def materialize(self, job: Job) -> bool:
        """Fill `job.tokens` (root → deepest block); False when the chain lost a segment since."""
        if job.generation != self.generation or job.id not in self._jobs:
            return False
        segments = self._segments(job.run[-1])
        if segments is None:
            return False
        tokens: array[int] = array("I")
        for segment in reversed(segments):
            tokens.extend(segment)
        job.tokens = tokens
        return True

    def _make_job(self, run: list[int], model: str | None) -> Job | None:
        if self._segments(run[-1]) is None:
            self._count("rebuild_failed")
            for key in run:
                self._kill(key, self.blocks[key])
            return None
        job = Job(self._next_job, self.generation, run, [self.blocks[k].depth for k in run], model)
        self._next_job += 1
        self._jobs[job.id] = job
        for key in run:
            block = self.blocks[key]
            block.state = State.PENDING
            block.job = job.id
        return job

    def _placeholder(self, event: Stored) -> None:
        """Offload placeholders carry identity only: they move a known block into a medium."""
        bit = self._bit(event.medium)
        for key in event.hashes:
            block = self.blocks.get(key)
            if block is None:
                self._count("placeholder_unknown")
            else:
                self._set_media(block, block.media | bit)

    def apply_removed(self, event: Removed) -> None:
        mask = ~0 if event.medium is None else self._bit(event.medium)
        for key in event.hashes:
            block = self.blocks.get(key)
            if block is None:
                self._count("remove_unknown")
                continue
            media = block.media & ~mask
            if media == block.media:
                continue
            if media == 0:
                del self.blocks[key]
                self._forget(key, block)
            else:
                self._set_media(block, media)

    def apply_moved(self, event: Moved) -> None:
        block = self.blocks.get(event.hash)
        if block is None:
            self._count("remove_unknown")
            return
        self._set_media(block, (block.media & ~self._bit(event.old_medium)) | self._bit(event.new_medium))

    def reset(self) -> None:
        """Forget everything without touching the DepthBook (the caller clears it and
        announces `cleared`)."""
        self.blocks = OrderedDict()
        self._token_blocks = OrderedDict()
        self.retained_tokens = 0
        self._jobs = {}
        self.generation += 1

    def withdraw(self) -> None:
        """Forget everything and withdraw every contribution (one rank of a multi-rank source
        restarted; the other ranks' blocks stay announced)."""
        for block in self.blocks.values():
            if block.state is State.ATTRIBUTED:
                self._contribute(block, block.media, -1)
        self.reset()

    def _enforce_limits(self) -> None:
        blocks, limits = self.blocks, self.limits
        while len(blocks) > limits.max_tracked_blocks:
            key, block = blocks.popitem(last=False)
            self._forget(key, block)
            self._count("pruned_blocks")
        while self.retained_tokens > limits.max_retained_tokens:
            key, _ = self._token_blocks.popitem(last=False)
            block = blocks[key]
            assert block.tokens is not None
            self.retained_tokens -= len(block.tokens)
            block.tokens = None
            if block.state is State.OPEN:
                block.state = State.DEAD
            self._count("pruned_tokens")

    # -- detokenize answers ------------------------------------------------------------------

    def resolve(self, job: Job, resolution: Resolution) -> list[Job]:
        """Apply a job's answer; returns follow-up jobs for runs that waited on it."""
        if job.generation != self.generation or self._jobs.pop(job.id, None) is None:
            return []
        outcome = resolution.outcome
        for index, key in enumerate(job.run):
            block = self.blocks.get(key)
            if block is None or block.job != job.id:
                continue
            if outcome is Outcome.DETERMINED and index >= resolution.index:
                assert resolution.prefix is not None
                self._attribute(key, block, resolution.prefix)
            elif outcome is Outcome.UNATTRIBUTABLE:
                self._kill(key, block)
            else:
                block.state = State.OPEN
                block.job = 0
        pending = [key for run in job.waiters for key in self._reclassify(run, job)]
        if outcome is Outcome.FAILED:
            return []  # the endpoint is failing: the next stored block retries, not a cascade
        follow: list[Job] = []
        for segment in self._segments_of(pending):
            head = self.blocks[segment[0]]
            parent = self.blocks.get(head.parent) if head.parent is not None else None
            if parent is not None and parent.state is State.PENDING and parent.job in self._jobs:
                self._jobs[parent.job].waiters.append(segment)
                for key in segment:
                    self.blocks[key].state, self.blocks[key].job = State.PENDING, parent.job
                continue
            new = self._make_job(segment, job.model)
            if new is not None:
                follow.append(new)
        return follow

    def _reclassify(self, run: list[int], job: Job) -> list[int]:
        """Classify blocks stored while their parent's job was in flight; returns those still
        open (in order)."""
        pending: list[int] = []
        for key in run:
            block = self.blocks.get(key)
            if block is None or block.job != job.id:
                continue
            parent = self.blocks.get(block.parent) if block.parent is not None else None
            state = parent.state if parent is not None else State.DEAD
            if state is State.ATTRIBUTED:
                assert parent is not None and parent.prefix is not None
                self._attribute(key, block, parent.prefix)
            elif state is State.DEAD:
                self._kill(key, block)
            else:
                block.state, block.job = State.OPEN, 0
                pending.append(key)
        return pending

    def _segments_of(self, keys: list[int]) -> list[list[int]]:
        """Split blocks into linear chain segments, so one job (one bisection) covers what
        arrived as many small runs — SGLang with page size 1 stores one block per token."""
        segments: list[list[int]] = []
        previous: int | None = None
        for key in keys:
            if segments and self.blocks[key].parent == previous:
                segments[-1].append(key)
            else:
                segments.append([key])
            previous = key
        return segments

    # -- inspection --------------------------------------------------------------------------

    def chain(self, key: int) -> list[int]:
        """Hashes from the chain root to `key` (as far as they are tracked)."""
        out: list[int] = []
        block = self.blocks.get(key)
        while block is not None:
            out.append(key)
            if block.parent is None:
                break
            key = block.parent
            block = self.blocks.get(key)
        out.reverse()
        return out

    @property
    def pending_jobs(self) -> int:
        return len(self._jobs)


def _tiers(media: int) -> int:
    """Bit 0: resident on GPU, bit 1: resident on some storage medium."""
    return (1 if media & _GPU_BIT else 0) | (2 if media & ~_GPU_BIT else 0)
