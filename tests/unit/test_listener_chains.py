"""The chain tracker and depth book: attribution, tiers, events, detokenize jobs, memory bounds."""

from __future__ import annotations

import random
from array import array

from continuum_common.events import EventType, Tier
from continuum_common.salt import make_salt
from continuum_listener.policy.chains import ChainTracker, Limits, Outcome, Resolution, State
from continuum_listener.policy.depths import GPU, STORAGE, DepthBook
from continuum_listener.protocol.model import Moved, Removed, Stored

SECRET = b"test-secret"
KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
BS = 4


def stored(hashes: list[int], parent: int | None, *, salt: str | None = None, medium: str = "GPU",
           tokens: list[int] | None = None, ok: bool = True) -> Stored:  # fmt: skip
    tokens = tokens if tokens is not None else [h % 1000 for h in hashes for _ in range(BS)]
    return Stored(
        hashes, parent, [BS] * len(hashes), tokens, ok, not ok, medium,
        [salt] + [None] * (len(hashes) - 1) if salt else None,
    )  # fmt: skip


DEFAULT_LIMITS = Limits()


def tracker(mode: str = "auto", *, detokenize: bool = False, limits: Limits = DEFAULT_LIMITS) -> ChainTracker:
    return ChainTracker(backend="vllm-1", book=DepthBook(), mode=mode, secret=SECRET, detokenize=detokenize,  # type: ignore[arg-type]
                        limits=limits)  # fmt: skip


def changes(t: ChainTracker) -> list[tuple[str, str, int]]:
    return [(c.type.value, c.tier.value, c.token_count) for c in t.book.flush()]


def test_salt_attributes_the_chain_and_depth_follows_the_deepest_block() -> None:
    t = tracker("salt_echo")
    salt = make_salt(SECRET, "vllm-1", KEY)
    assert t.apply_stored(stored([1, 2], None, salt=salt)) == []
    assert t.apply_stored(stored([3], 2)) == []
    assert [t.blocks[h].state for h in (1, 2, 3)] == [State.ATTRIBUTED] * 3
    assert [t.blocks[h].depth for h in (1, 2, 3)] == [4, 8, 12]
    assert t.chain(3) == [1, 2, 3]
    assert t.retained_tokens == 0  # salt chains never keep tokens
    assert changes(t) == [("created", "gpu_hot", 12)]
    t.apply_removed(Removed([3]))
    assert changes(t) == [("updated", "gpu_hot", 8)]
    t.apply_removed(Removed([1, 2]))
    assert changes(t) == [("evicted", "gpu_hot", 0)]
    assert len(t.blocks) == 0 and len(t.book) == 0


def test_forged_missing_and_foreign_salts() -> None:
    t = tracker("salt_echo")
    t.apply_stored(stored([1], None, salt=make_salt(b"wrong", "vllm-1", KEY)))
    t.apply_stored(stored([2], None, salt=make_salt(SECRET, "vllm-2", KEY)))  # minted for another backend
    t.apply_stored(stored([3], None))
    t.apply_stored(stored([4], 1))  # child of a discarded chain
    assert all(t.blocks[h].state is State.DEAD for h in (1, 2, 3, 4))
    assert t.drain_counts() == {"salt_invalid": 2, "salt_missing": 1}
    assert changes(t) == []


def test_auto_without_detokenize_and_orphans() -> None:
    t = tracker("auto")
    t.apply_stored(stored([1], None))
    t.apply_stored(stored([9], 77))  # parent never seen
    assert t.drain_counts() == {"no_method": 1, "orphan": 1}
    assert changes(t) == []


def test_two_prefixes_and_coalescing() -> None:
    t = tracker()
    t.apply_stored(stored([1], None, salt=make_salt(SECRET, "vllm-1", KEY)))
    t.apply_stored(stored([2], None, salt=make_salt(SECRET, "vllm-1", OTHER)))
    t.apply_stored(stored([3, 4], 2))
    t.apply_removed(Removed([4]))
    t.apply_stored(stored([5], 1))
    t.apply_removed(Removed([5]))  # came and went inside one window
    got = {(c.prefix, c.type, c.token_count) for c in t.book.flush()}
    assert got == {(KEY, EventType.CREATED, 4), (OTHER, EventType.CREATED, 8)}


def test_storage_tiers_offload_placeholders_and_moves() -> None:
    t = tracker()
    salt = make_salt(SECRET, "vllm-1", KEY)
    t.apply_stored(stored([1, 2], None, salt=salt, medium="CPU"))
    assert changes(t) == [("offloaded", "storage_warm", 8)]
    t.apply_stored(Stored([3], None, [0], [], False, False, "FS", None, None, placeholder=True))
    assert t.drain_counts() == {"placeholder_unknown": 1}
    t.apply_stored(stored([1, 2], None, salt=salt, medium="GPU"))  # same blocks now also on GPU
    assert changes(t) == [("created", "gpu_hot", 8)]
    t.apply_removed(Removed([2], "GPU"))
    assert changes(t) == [("updated", "gpu_hot", 4)]
    t.apply_stored(Stored([1], None, [0], [], False, False, "FS", None, None, placeholder=True))
    t.apply_removed(Removed([1], "CPU"))  # still on FS: the storage tier keeps block 1
    assert changes(t) == []  # block 2 (depth 8) is still on CPU
    assert t.book.depth(STORAGE, KEY) == 8 and t.book.depth(GPU, KEY) == 4
    t.apply_moved(Moved(1, "GPU", "CPU"))
    assert t.book.depth(GPU, KEY) == 0
    t.apply_removed(Removed([1, 2], None))  # gone from every medium
    assert t.book.depth(STORAGE, KEY) == 0 and not t.blocks


def test_idempotent_restore_does_not_double_count() -> None:
    t = tracker()
    salt = make_salt(SECRET, "vllm-1", KEY)
    for _ in range(3):
        t.apply_stored(stored([1, 2], None, salt=salt))
    assert changes(t) == [("created", "gpu_hot", 8)]
    t.apply_removed(Removed([1, 2]))
    assert changes(t) == [("evicted", "gpu_hot", 0)]


def test_mismatched_block_inherits_but_has_no_tokens() -> None:
    t = tracker(detokenize=True)
    t.apply_stored(stored([1], None, salt=make_salt(SECRET, "vllm-1", KEY)))
    t.apply_stored(stored([2], 1, tokens=[1, 2, 3], ok=False))
    assert t.blocks[2].state is State.ATTRIBUTED and t.blocks[2].tokens is None
    # Without an attributed parent a mismatched block can never be rebuilt: DEAD, and so are its children.
    t.apply_stored(stored([3], None, tokens=[1], ok=False))
    jobs = t.apply_stored(stored([4], 3))
    assert jobs == [] and t.blocks[3].state is State.DEAD and t.blocks[4].state is State.DEAD


def test_detokenize_job_attributes_only_from_the_determining_block() -> None:
    t = tracker("detokenize", detokenize=True)
    jobs = t.apply_stored(stored([1, 2, 3], None))
    assert len(jobs) == 1
    job = jobs[0]
    assert job.run == [1, 2, 3] and job.depths == [4, 8, 12] and job.tokens is None  # queued jobs hold no tokens
    assert t.materialize(job) and job.tokens is not None and len(job.tokens) == 12
    assert t.retained_tokens == 12 and all(t.blocks[h].state is State.PENDING for h in (1, 2, 3))
    # A child stored while the job is in flight waits for it instead of starting its own.
    assert t.apply_stored(stored([4], 3)) == []
    assert t.blocks[4].state is State.PENDING
    follow = t.resolve(job, Resolution(Outcome.DETERMINED, 1, KEY))
    assert follow == []
    assert [t.blocks[h].state for h in (1, 2, 3, 4)] == [
        State.OPEN,
        State.ATTRIBUTED,
        State.ATTRIBUTED,
        State.ATTRIBUTED,
    ]
    assert t.retained_tokens == 4  # only the shared head keeps its tokens
    assert changes(t) == [("created", "gpu_hot", 16)]
    # A new branch off the OPEN head needs its own job with the head's tokens.
    (branch,) = t.apply_stored(stored([5], 1))
    assert t.materialize(branch) and branch.run == [5] and list(branch.tokens or []) == [1] * 4 + [5] * 4


def test_pending_and_failed_jobs_leave_blocks_open_for_a_retry() -> None:
    t = tracker("detokenize", detokenize=True)
    (job,) = t.apply_stored(stored([1], None))
    t.apply_stored(stored([2], 1))  # waits on job
    (follow,) = t.resolve(job, Resolution(Outcome.PENDING))
    assert follow.run == [2] and t.blocks[1].state is State.OPEN
    assert t.resolve(follow, Resolution(Outcome.FAILED)) == []
    assert t.blocks[2].state is State.OPEN
    (retry,) = t.apply_stored(stored([3], 2))
    assert t.materialize(retry) and list(retry.tokens or []) == [1] * 4 + [2] * 4 + [3] * 4
    t.resolve(retry, Resolution(Outcome.UNATTRIBUTABLE))
    assert t.blocks[3].state is State.DEAD and t.blocks[3].tokens is None


def test_resolution_after_a_reset_is_ignored() -> None:
    t = tracker("detokenize", detokenize=True)
    (job,) = t.apply_stored(stored([1], None))
    t.reset()
    assert not t.materialize(job)
    assert t.resolve(job, Resolution(Outcome.DETERMINED, 0, KEY)) == []
    assert not t.blocks and changes(t) == []


def test_chain_too_long_and_bad_tokens() -> None:
    t = tracker("detokenize", detokenize=True, limits=Limits(max_chain_tokens=8))
    (job,) = t.apply_stored(stored([1, 2, 3], None))
    assert job.run == [1, 2] and t.blocks[3].state is State.DEAD
    t.apply_stored(stored([7], None, tokens=[-1, 2, 3, 4]))
    t.apply_stored(stored([8], None, tokens=[[1, 2], [3, 4], [5, 6], [7, 8]]))  # type: ignore[list-item]  # EAGLE pairs
    assert t.blocks[7].state is State.DEAD
    assert t.blocks[8].tokens == array("I", [1, 3, 5, 7])
    assert t.drain_counts() == {"chain_too_long": 1, "bad_tokens": 1}


def test_withdraw_removes_only_this_trackers_contributions() -> None:
    book = DepthBook()
    a = ChainTracker(backend="t", book=book, secret=SECRET)
    b = ChainTracker(backend="t", book=book, secret=SECRET)
    a.apply_stored(stored([1, 2], None, salt=make_salt(SECRET, "t", KEY)))
    b.apply_stored(stored([1], None, salt=make_salt(SECRET, "t", KEY)))
    assert [(c.type, c.token_count) for c in book.flush()] == [(EventType.CREATED, 8)]
    a.withdraw()
    assert [(c.type, c.token_count) for c in book.flush()] == [(EventType.UPDATED, 4)]
    b.withdraw()
    assert [(c.type, c.tier) for c in book.flush()] == [(EventType.EVICTED, Tier.GPU_HOT)]


def test_snapshot_and_forget_announced() -> None:
    t = tracker()
    t.apply_stored(stored([1], None, salt=make_salt(SECRET, "vllm-1", KEY)))
    t.apply_stored(stored([2], None, salt=make_salt(SECRET, "vllm-1", OTHER)))
    t.book.flush()
    t.apply_stored(stored([3], 2))  # not flushed yet: not in the snapshot
    assert sorted((c.prefix, c.token_count) for c in t.book.snapshot()) == [(KEY, 4), (OTHER, 4)]
    t.book.forget_announced()
    assert t.book.snapshot() == []
    assert sorted((c.type.value, c.token_count) for c in t.book.flush()) == [("created", 8)]
    t.apply_removed(Removed([1]))
    t.apply_stored(stored([4], 1))
    assert t.book.flush() == []  # KEY was never re-announced and is gone again


def test_memory_limits_prune_oldest_entries_never_everything() -> None:
    limits = Limits(max_chain_tokens=64, max_tracked_blocks=50, max_retained_tokens=40)
    t = tracker("auto", detokenize=True, limits=limits)
    rng = random.Random(7)
    live: list[int] = []
    next_hash = 1
    for step in range(3000):
        roll = rng.random()
        if roll < 0.6 or not live:
            parent = rng.choice(live) if live and rng.random() < 0.7 else None
            n = rng.randint(1, 4)
            hashes = list(range(next_hash, next_hash + n))
            next_hash += n
            salt = (
                make_salt(SECRET, "vllm-1", bytes([step % 7]) * 32) if parent is None and rng.random() < 0.5 else None
            )
            for job in t.apply_stored(stored(hashes, parent, salt=salt)):
                if rng.random() < 0.5:
                    t.resolve(job, Resolution(Outcome.DETERMINED, 0, bytes([99]) * 32))
            live.extend(hashes)
        else:
            victim = live.pop(rng.randrange(len(live)))
            t.apply_removed(Removed([victim]))
        t.book.flush()
        live = [h for h in live if h in t.blocks]
        assert len(t.blocks) <= limits.max_tracked_blocks
        assert t.retained_tokens <= limits.max_retained_tokens
        assert t.retained_tokens == sum(len(b.tokens) for b in t.blocks.values() if b.tokens is not None)
        if step > 500:
            assert len(t.blocks) >= limits.max_tracked_blocks // 2  # pruning is per entry, not a reset
    counts = t.drain_counts()
    assert counts.get("pruned_blocks", 0) > 0 and counts.get("pruned_tokens", 0) > 0
    # Every announced depth is backed by a tracked, attributed block.
    for tier, entries in enumerate(t.book._entries):
        for prefix, entry in entries.items():
            if entry.counts:
                assert any(
                    (b.prefix == prefix and b.state is State.ATTRIBUTED and bool(b.media & 1) == (tier == GPU))
                    or (b.prefix == prefix and tier == STORAGE)
                    for b in t.blocks.values()
                )


def test_depth_book_lazy_heap_compacts() -> None:
    book = DepthBook()
    for depth in range(1, 200):
        book.add(GPU, KEY, depth)
    for depth in range(1, 199):
        book.remove(GPU, KEY, depth)
    assert book.depth(GPU, KEY) == 199
    book.remove(GPU, KEY, 199)
    assert book.depth(GPU, KEY) == 0
    book.remove(GPU, b"missing", 3)  # unknown keys and depths are ignored


def test_page_size_one_chains_need_one_job_per_resolution_not_one_per_token() -> None:
    t = tracker("detokenize", detokenize=True)
    (job,) = t.apply_stored(Stored([1], None, [1], [7], True, False))
    for h in range(2, 101):  # SGLang page size 1: one event per token, all while job 1 is in flight
        assert t.apply_stored(Stored([h], h - 1, [1], [7], True, False)) == []
    (follow,) = t.resolve(job, Resolution(Outcome.PENDING))
    assert follow.run == list(range(2, 101)) and follow.depths[-1] == 100
    assert t.materialize(follow) and follow.tokens is not None and len(follow.tokens) == 100
    assert t.resolve(follow, Resolution(Outcome.DETERMINED, 40, KEY)) == []
    assert t.blocks[41].state is State.OPEN and t.blocks[42].state is State.ATTRIBUTED
    assert changes(t) == [("created", "gpu_hot", 100)]
