"""Prefix-cache behaviour on scripted sequences, checked against vLLM v1's rules."""

from __future__ import annotations

from continuum_sim.policy.block_pool import BlockPool
from continuum_sim.policy.kv_manager import KVCacheManager
from continuum_sim.policy.request import SimRequest
from continuum_sim.policy.scheduler import Scheduler
from continuum_sim.protocol.block_hash import none_hash
from continuum_sim.protocol.kv_wire import RemovedEvent, StoredEvent

ROOT = none_hash("0")
BS = 4


def req(rid: str, prompt: list[int], out: int = 2, salt: str | None = None) -> SimRequest:
    return SimRequest(rid, prompt, list(range(900, 900 + out)), block_size=BS, hash_root=ROOT, cache_salt=salt)


def run_to_completion(sched: Scheduler) -> list[SimRequest]:
    done: list[SimRequest] = []
    for _ in range(1000):
        if not sched.has_work:
            return done
        step = sched.schedule()
        done += [o.request for o in sched.complete(step) if o.finished]
    raise AssertionError("scheduler did not drain")


def make(num_blocks: int = 64, **kw: int) -> tuple[BlockPool, KVCacheManager, Scheduler]:
    pool = BlockPool(num_blocks, BS)
    kv = KVCacheManager(pool)
    opts = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "max_waiting": 100} | kw
    return pool, kv, Scheduler(kv, **opts)


def test_hits_count_whole_blocks_and_never_the_last_token() -> None:
    _, _, sched = make()
    prompt = list(range(8))  # exactly two blocks
    first = req("a", prompt)
    sched.add(first)
    run_to_completion(sched)
    assert first.num_cached_tokens == 0
    same = req("b", prompt)  # fully cached, but the last token must be recomputed: 1 block
    longer = req("c", [*prompt, 50])  # 9 tokens: both blocks reusable
    partial = req("d", [*prompt[:6], 77, 78, 79])  # diverges inside block 2: only block 1
    for r in (same, longer, partial):
        sched.add(r)
        run_to_completion(sched)
    assert (same.num_cached_tokens, longer.num_cached_tokens, partial.num_cached_tokens) == (4, 8, 4)
    stats = sched.kv.stats
    assert stats.queries == 8 + 8 + 9 + 9 and stats.hits == 4 + 8 + 4


def test_output_tokens_are_cached_like_vllm() -> None:
    """Generated tokens fill blocks too; the last generated token's KV is never computed."""
    pool, _, sched = make()
    first = req("a", list(range(6)), out=3)  # 6 prompt + 3 output = 9 tokens, 8 computed → 2 blocks
    sched.add(first)
    run_to_completion(sched)
    stored = [e for e in pool.take_events() if isinstance(e, StoredEvent)]
    assert sum(len(e.digests) for e in stored) == 2
    follow = req("b", [*range(6), 900, 901, 902, 5])  # next turn: prompt + answer + more
    sched.add(follow)
    run_to_completion(sched)
    assert follow.num_cached_tokens == 8


def test_lru_evicts_tail_blocks_first_and_never_running_ones() -> None:
    pool, kv, _ = make(num_blocks=7)  # 6 usable blocks
    a = req("a", list(range(100, 112)), out=1)  # 3 blocks
    assert kv.allocate_slots(a, 12)
    b = req("b", list(range(200, 212)), out=1)
    assert kv.allocate_slots(b, 12)  # pool now full, everything referenced
    pool.take_events()
    c = req("c", list(range(300, 308)), out=1)
    assert not kv.allocate_slots(c, 8), "blocks of running requests must not be evicted"
    assert pool.take_events() == []
    a_ids = [blk.block_id for blk in a.blocks]
    a_hashes = [blk.block_hash for blk in a.blocks]
    kv.free(a)
    assert pool.free_queue_ids() == a_ids[::-1], "a request's tail blocks come first in the LRU"
    assert kv.allocate_slots(c, 8)  # needs 2 blocks: a's last two blocks go
    removed = pool.take_events()
    removed_hashes = [e.digests[0] for e in removed if isinstance(e, RemovedEvent)]
    assert removed_hashes == [a_hashes[2], a_hashes[1]], "one BlockRemoved per evicted block"
    assert pool.is_cached(a_hashes[0]) and not pool.is_cached(a_hashes[1])


def test_hit_takes_free_cached_block_out_of_the_lru() -> None:
    pool, kv, sched = make(num_blocks=9)
    a = req("a", list(range(8)))
    sched.add(a)
    run_to_completion(sched)
    first_block = a.block_hashes[0]
    b = req("b", [0, 1, 2, 3, 60, 61, 62, 63, 64])  # hits a's first block
    hit, tokens = kv.get_computed_blocks(b)
    assert tokens == 4 and hit[0].block_hash == first_block
    assert hit[0].block_id in pool.free_queue_ids()
    assert kv.allocate_slots(b, 5, hit)
    assert hit[0].block_id not in pool.free_queue_ids() and hit[0].ref_cnt == 1
    kv.free(b)
    assert pool.free_queue_ids()[-1] == hit[0].block_id, "freed again: now most recently used"


def test_cache_salt_isolates_prefixes() -> None:
    _, _, sched = make()
    prompt = list(range(12))
    order = [req("s1", prompt, salt="tenant-a"), req("s2", prompt, salt="tenant-b"), req("s3", prompt, salt="tenant-a")]
    for r in order:
        sched.add(r)
        run_to_completion(sched)
    assert [r.num_cached_tokens for r in order] == [0, 0, 8]


def test_same_step_admission_shares_blocks_scheduled_earlier() -> None:
    _, _, sched = make()
    prompt = list(range(16))
    a, b = req("a", prompt), req("b", [*prompt, 99])
    sched.add(a)
    sched.add(b)
    step = sched.schedule()
    assert [r.request_id for r, _ in step.prefill] == ["a", "b"]
    assert b.num_cached_tokens == 16, "blocks are cached when scheduled, so b hits a's blocks at once"


def test_max_num_seqs_and_token_budget_queue_requests() -> None:
    _, _, sched = make(max_num_seqs=2, max_num_batched_tokens=10)
    for i in range(3):
        sched.add(req(f"r{i}", list(range(i * 100, i * 100 + 8))))
    step = sched.schedule()
    assert [(r.request_id, n) for r, n in step.prefill] == [("r0", 8), ("r1", 2)]  # chunked prefill
    assert [r.request_id for r in sched.waiting] == ["r2"]
    assert len(run_to_completion(sched)) == 3


def test_preemption_frees_the_newest_request_and_recomputes_it() -> None:
    pool, _, sched = make(num_blocks=5, max_num_seqs=4, max_num_batched_tokens=64)  # 4 usable blocks
    a = req("a", list(range(7)), out=6)  # grows to 12 tokens = 3 blocks
    b = req("b", list(range(50, 57)), out=6)
    sched.add(a)
    sched.add(b)
    done = run_to_completion(sched)
    assert {r.request_id for r in done} == {"a", "b"}
    assert sched.num_preemptions >= 1 and b.num_preemptions >= 1 and a.num_preemptions == 0
    assert pool.num_free_blocks == pool.capacity
    assert b.output_token_ids == list(range(900, 906)), "a preempted request still yields its whole answer"


def test_abort_frees_blocks() -> None:
    pool, _, sched = make()
    a = req("a", list(range(20)), out=50)
    sched.add(a)
    sched.complete(sched.schedule())
    assert pool.num_free_blocks < pool.capacity
    sched.abort(a)
    sched.complete(sched.schedule())
    assert not sched.has_work and pool.num_free_blocks == pool.capacity


def test_multi_token_decode_steps_emit_the_same_tokens() -> None:
    _, _, sched = make()
    a = req("a", list(range(5)), out=10)
    sched.add(a)
    emitted: list[int] = []
    while sched.has_work:
        emitted += [t for o in sched.complete(sched.schedule(decode_tokens=4)) for t in o.new_token_ids]
    assert emitted == list(range(900, 910))
