"""Precise matching inside a real ingress: a local tokenizer (a real byte-level BPE trained in
the test), the engine's block hashes published as KV batches on a real nats-server into the
embedded block index, stub upstreams over loopback HTTP. The ingress must recompute exactly the
hashes the engine reports and route to the backend holding the longest prefix; every failure
of the tokenizer path falls back to approximate keys and is counted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from continuum_common.hashing.blocks import make_block_hasher
from continuum_common.procs import NatsServer
from continuum_common.tokenization import LocalTokenizer
from continuum_common.tokenization import encoder as encoder_module
from continuum_common.wire.kv import AllCleared, BlocksStored, KvBatch
from continuum_sim.hf_tokenizer import TokenizerFiles, train_tokenizer
from continuum_testing.indexer_harness import ensure_stream, publish_batches
from continuum_testing.ingress_harness import RunningIngress, running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs

BLOCK = 16
SYSTEM = "You are a meticulous assistant who answers questions about the attached report. " * 20


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory: pytest.TempPathFactory) -> TokenizerFiles:
    return train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=1024)


def config(stubs: Any, nats_url: str, files: TokenizerFiles | None, **group: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "fleet", "models": ["m"], "mode": "precise", "engine": "vllm"}
    spec.update(block_size=BLOCK, hash_seed="0", **group)
    if files is not None:
        spec.setdefault("tokenizer", str(files.tokenizer))
        spec.setdefault("chat_template", str(files.chat_template))
    return {
        "backends": stub_backends(stubs),
        "selection_strategy": "RoundRobin",
        "prefix_routing": {"enabled": True},
        "bus": {"embedded": False, "url": nats_url, "request_timeout_ms": 500},
        "kv_cache_index": {"enabled": True, "backend": "memory", "groups": [spec]},
    }


@asynccontextmanager
async def ingress(cfg: dict[str, Any]) -> AsyncIterator[tuple[RunningIngress, httpx.AsyncClient]]:
    async with running_ingress(cfg) as ing, httpx.AsyncClient(base_url=ing.url, timeout=10) as c:
        assert ing.app.kv is not None
        async with asyncio.timeout(10):
            await ing.app.kv.ready.wait()
        yield ing, c


def engine_hashes(files: TokenizerFiles, messages: list[dict[str, str]]) -> list[int]:
    """What a vLLM engine with this tokenizer reports for the prompt (PYTHONHASHSEED=0)."""
    tok = LocalTokenizer(files.tokenizer, chat_template=files.chat_template)
    hasher = make_block_hasher("vllm", BLOCK, hash_seed="0", vllm_hash_algo="sha256_cbor")
    ids = tok.encode(tok.render_chat(messages, add_generation_prompt=True), add_special_tokens=False)
    return [hasher.wire(d) for d in hasher.chain(ids)]


def sample(ing: RunningIngress, name: str, **labels: str) -> float:
    return ing.app.metrics.registry.get_sample_value(name, labels) or 0.0


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


def chat(messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"model": "m", "messages": messages}


async def test_routes_to_the_backend_holding_the_engine_blocks(
    nats_server: NatsServer, tokenizer_files: TokenizerFiles
) -> None:
    await ensure_stream(nats_server.url)
    async with (
        running_stubs("a", "b", "c") as stubs,
        ingress(config(stubs, nats_server.url, tokenizer_files)) as (
            ing,
            c,
        ),
    ):
        # a conversation in progress (a first turn would be placed for balance, not matched)
        doc = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Here is the report."},
            {"role": "assistant", "content": "Thank you, I have read it."},
            {"role": "user", "content": "Summarise section two, please."},
        ]
        hashes = engine_hashes(tokenizer_files, doc)
        assert len(hashes) > 20
        # engine c reports the whole prompt, engine b only its first quarter
        now = time.time()
        await publish_batches(
            nats_server.url,
            [
                KvBatch("c", 1, 1, now, [AllCleared(), BlocksStored(hashes, None, BLOCK, 0)]),
                KvBatch("b", 1, 1, now, [AllCleared(), BlocksStored(hashes[: len(hashes) // 4], None, BLOCK, 0)]),
            ],
        )
        blocks = ing.app.kv.embedded.blocks  # type: ignore[union-attr]
        await eventually(lambda: blocks.match_nowait(hashes, ["c"])["c"].gpu_blocks == len(hashes))
        for _ in range(3):  # RoundRobin alone would rotate a, b, c
            r = await c.post("/v1/chat/completions", json=chat(doc))
            assert r.status_code == 200 and r.headers["x-continuum-backend"] == "c"
        assert sample(ing, "continuum_kv_index_routing_decisions_total", decision="kv_aware", tier="gpu_hot") == 3
        assert sample(ing, "continuum_kv_request_keys_seconds_count", mode="precise") == 3
        # the engine clears its cache: the index forgets it, the request goes to b's quarter
        await publish_batches(nats_server.url, [KvBatch("c", 1, 2, time.time(), [AllCleared()])])
        await eventually(lambda: blocks.match_nowait(hashes, ["c"])["c"].gpu_blocks == 0)
        ing.app.kv.selector.wipe("c")  # what the generation watch does within a second  # type: ignore[union-attr]
        r = await c.post("/v1/chat/completions", json=chat(doc))
        assert r.headers["x-continuum-backend"] in ("a", "b")


async def test_a_new_prompt_sticks_by_speculative_entries(
    nats_server: NatsServer, tokenizer_files: TokenizerFiles
) -> None:
    async with (
        running_stubs("a", "b", "c") as stubs,
        ingress(config(stubs, nats_server.url, tokenizer_files)) as (
            ing,
            c,
        ),
    ):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "A first question."}]
        first = (await c.post("/v1/chat/completions", json=chat(messages))).headers["x-continuum-backend"]
        # no engine event has arrived: the speculative entries keep the conversation together
        for turn in range(3):
            messages = [
                *messages,
                {"role": "assistant", "content": "An answer."},
                {"role": "user", "content": f"Q{turn}"},
            ]
            r = await c.post("/v1/chat/completions", json=chat(messages))
            assert r.headers["x-continuum-backend"] == first
        assert sample(ing, "continuum_kv_index_routing_decisions_total", decision="kv_aware", tier="gpu_hot") == 3


async def test_without_a_tokenizer_the_backends_tokenize_endpoint_is_used_and_failures_fall_back(
    nats_server: NatsServer,
) -> None:
    async with (
        running_stubs("a", "b") as stubs,
        ingress(config(stubs, nats_server.url, None, tokenize_new_prompts="on_path")) as (ing, c),
    ):
        # the stubs have no /tokenize: every request asks on its path and falls back to
        # approximate keys, counted
        for _ in range(2):
            r = await c.post("/v1/chat/completions", json=chat([{"role": "user", "content": "hello " * 300}]))
            assert r.status_code == 200
        assert sample(ing, "continuum_kv_precise_fallbacks_total", group="fleet", reason="tokenize_failed") == 2
        # the second (a first turn again) holds its whole prompt where the first went: placed there
        assert sample(ing, "continuum_kv_index_routing_decisions_total", decision="placed", tier="gpu_hot") == 1
        assert sample(ing, "continuum_kv_affinity_moves_total", reason="placed") == 0


async def test_an_unreadable_tokenizer_disables_precise_matching_but_serves(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    async with (
        running_stubs("a", "b") as stubs,
        ingress(config(stubs, nats_server.url, None, tokenizer=str(bad))) as (ing, c),
    ):
        r = await c.post("/v1/chat/completions", json=chat([{"role": "user", "content": "hi " * 200}]))
        assert r.status_code == 200
        assert sample(ing, "continuum_kv_precise_fallbacks_total", group="fleet", reason="disabled") == 1


async def test_the_tokenizer_audit_turns_precise_matching_off_when_the_engine_disagrees(
    nats_server: NatsServer, tokenizer_files: TokenizerFiles
) -> None:
    async with running_stubs("a") as stubs, ingress(config(stubs, nats_server.url, tokenizer_files)) as (ing, c):
        kv = ing.app.kv
        assert kv is not None
        audit = kv.selector.audits["fleet"]
        audit.every = 1  # check every request
        # the stub answers /tokenize with 404: audits count errors, precise stays on
        await c.post("/v1/chat/completions", json=chat([{"role": "user", "content": "x " * 100}]))
        await eventually(lambda: sample(ing, "continuum_kv_tokenizer_audits_total", group="fleet", result="error") >= 1)
        assert kv.selector.groups["fleet"].precise_disabled is None


async def test_the_tokenizer_audit_waits_for_a_slow_tokenize_longer_than_a_request_would(
    nats_server: NatsServer, tokenizer_files: TokenizerFiles
) -> None:
    tok = LocalTokenizer(tokenizer_files.tokenizer, chat_template=tokenizer_files.chat_template)

    def engine_tokenize(body: dict[str, Any]) -> list[int]:
        text = tok.render_chat(body["messages"], add_generation_prompt=body.get("add_generation_prompt", True))
        return tok.encode(text, add_special_tokens=False)

    async with running_stubs("a") as stubs:
        # an engine busy prefilling: /tokenize answers well past the 50 ms a request would wait
        stubs[0].stub.tokenize, stubs[0].stub.tokenize_delay = engine_tokenize, 0.3
        async with ingress(config(stubs, nats_server.url, tokenizer_files, tokenize_timeout_ms=50)) as (ing, c):
            kv = ing.app.kv
            assert kv is not None
            kv.selector.audits["fleet"].every = 1
            r = await c.post("/v1/chat/completions", json=chat([{"role": "user", "content": "x " * 100}]))
            assert r.status_code == 200
            await eventually(
                lambda: sample(ing, "continuum_kv_tokenizer_audits_total", group="fleet", result="match") >= 1
            )
            assert sample(ing, "continuum_kv_tokenizer_audits_total", group="fleet", result="error") == 0
            assert [q.path for q in stubs[0].stub.requests].count("/tokenize") == 1


async def test_a_new_prompt_goes_to_the_least_busy_backend_unless_the_index_is_unreadable(
    nats_server: NatsServer, tokenizer_files: TokenizerFiles
) -> None:
    async with (
        running_stubs("a", "b", "c") as stubs,
        ingress(config(stubs, nats_server.url, tokenizer_files)) as (ing, c),
    ):

        async def new_prompt(i: int) -> str:
            body = chat([{"role": "user", "content": f"Document {i}: " + f"paragraph {i} " * 200}])
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200
            return r.headers["x-continuum-backend"]

        # nothing is held of any of these: each goes where the least new work went recently,
        # and the three new prompts (equal in size) land on three backends
        homes = [await new_prompt(i) for i in range(3)]
        assert sorted(homes) == ["a", "b", "c"]
        decisions = "continuum_kv_index_routing_decisions_total"
        assert sample(ing, decisions, decision="placed", tier="none") == 3
        assert sample(ing, decisions, decision="fallback", tier="none") == 0
        # The block index cannot be read (here: not open): nothing is known of a new prompt,
        # and the configured strategy picks, counted as a fallback and a read error.
        assert ing.app.kv is not None
        ing.app.kv.block_reads.index = None
        for i in range(3, 5):
            await new_prompt(i)
        assert sample(ing, decisions, decision="fallback", tier="none") == 2
        assert sample(ing, decisions, decision="placed", tier="none") == 3
        assert sample(ing, "continuum_kv_block_index_read_errors_total") == 2


async def test_only_the_held_part_is_encoded_before_routing_and_the_rest_after(
    nats_server: NatsServer, tokenizer_files: TokenizerFiles
) -> None:
    """`tokenize_unheld_text: off_path` (the default): a long prompt whose head an engine holds
    is encoded only a little past that head, routed there, and encoded whole once the request
    was forwarded: its whole chain is then recorded where it went, and the next turn's known
    start is found without tokenizing it again."""
    await ensure_stream(nats_server.url)
    async with (
        running_stubs("a", "b", "c") as stubs,
        ingress(config(stubs, nats_server.url, tokenizer_files)) as (
            ing,
            c,
        ),
    ):
        kv = ing.app.kv
        assert kv is not None
        group = kv.selector.groups["fleet"]
        head = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Here is the report."}]
        doc = [*head, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Long text. " * 1500}]
        whole = engine_hashes(tokenizer_files, doc)
        held = engine_hashes(tokenizer_files, head)[:-1]  # the generation prompt's block differs
        assert whole[: len(held)] == held and len(whole) > 4 * len(held)
        await publish_batches(nats_server.url, [KvBatch("b", 1, 1, time.time(), [BlocksStored(held, None, BLOCK, 0)])])
        blocks = kv.embedded.blocks  # type: ignore[union-attr]
        await eventually(lambda: blocks.match_nowait(held, ["b"])["b"].gpu_blocks == len(held))

        stats = group.encoder.stats  # type: ignore[union-attr]
        r = await c.post("/v1/chat/completions", json=chat(doc))
        assert r.status_code == 200 and r.headers["x-continuum-backend"] == "b"
        assert sample(ing, "continuum_kv_local_encoding_total", group="fleet", how="held") == 1
        await eventually(
            lambda: sample(ing, "continuum_kv_local_encoding_total", group="fleet", how="rest_encoded") == 1
        )
        assert stats.hashed_blocks >= len(whole), "the rest was encoded after the request went"
        # the whole chain is recorded where the request went
        now = kv.selector.clock()
        assert group.memory.extends("b", whole, len(held), now) == len(whole)
        assert group.memory.extends("a", whole, 0, now) == 0
        # the same prompt again: known whole (no piece encoded again), held whole, and it sticks
        misses, hashed = stats.node_misses, stats.hashed_blocks
        r = await c.post("/v1/chat/completions", json=chat(doc))
        assert r.headers["x-continuum-backend"] == "b"
        assert (stats.node_misses, stats.hashed_blocks) == (misses, hashed)
        assert sample(ing, "continuum_kv_local_encoding_total", group="fleet", how="whole") == 1


async def test_the_rest_is_encoded_a_slice_per_loop_turn(
    nats_server: NatsServer, tokenizer_files: TokenizerFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long rest is encoded over many turns of the event loop (a slice each, here the
    smallest), not in one callback that would hold up everything else the loop serves, and
    the chain it ends with is the engine's own."""
    async with (
        running_stubs("a", "b") as stubs,
        ingress(config(stubs, nats_server.url, tokenizer_files)) as (ing, c),
    ):
        kv = ing.app.kv
        assert kv is not None
        selector = kv.selector
        rests = selector._rests
        monkeypatch.setattr(rests, "slice_seconds", 0.0)
        slices = 0
        encode = rests._encode

        def counted() -> None:
            nonlocal slices
            slices += 1
            encode()

        monkeypatch.setattr(rests, "_encode", counted)
        doc = [{"role": "user", "content": "".join(f"Fresh text number {i}. " for i in range(600))}]
        r = await c.post("/v1/chat/completions", json=chat(doc))
        assert r.status_code == 200
        await eventually(
            lambda: sample(ing, "continuum_kv_local_encoding_total", group="fleet", how="rest_encoded") == 1
        )
        assert slices >= 10, "the rest went a few pieces per loop turn"
        whole = engine_hashes(tokenizer_files, doc)
        backend = r.headers["x-continuum-backend"]
        group = selector.groups["fleet"]
        assert group.memory.extends(backend, whole, 0, selector.clock()) == len(whole)


async def test_a_long_held_part_lets_the_loop_serve_others_between_steps(
    nats_server: NatsServer, tokenizer_files: TokenizerFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held part the encoder has not cached is encoded on the request path in steps, and the
    event loop serves other tasks between them (here after every step) instead of holding
    everything else up for the whole held part; the request still goes to the holder."""
    await ensure_stream(nats_server.url)
    async with (
        running_stubs("a", "b") as stubs,
        ingress(config(stubs, nats_server.url, tokenizer_files)) as (ing, c),
    ):
        kv = ing.app.kv
        assert kv is not None
        selector = kv.selector
        monkeypatch.setattr(selector, "held_slice_seconds", 0.0)
        head = [{"role": "system", "content": SYSTEM * 12}, {"role": "user", "content": "Here is the report."}]
        held = engine_hashes(tokenizer_files, head)[:-1]
        await publish_batches(nats_server.url, [KvBatch("b", 1, 1, time.time(), [BlocksStored(held, None, BLOCK, 0)])])
        blocks = kv.embedded.blocks  # type: ignore[union-attr]
        await eventually(lambda: blocks.match_nowait(held, ["b"])["b"].gpu_blocks == len(held))

        turns = 0  # loop turns another task got while the request was routed

        async def ticker() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        seen: list[int] = []  # the ticker's count at each step of the held part's encoding
        extend = encoder_module.PartialPrompt.extend

        def recorded(self: Any, pieces: int) -> None:
            seen.append(turns)
            extend(self, pieces)

        monkeypatch.setattr(encoder_module.PartialPrompt, "extend", recorded)
        task = asyncio.create_task(ticker())
        try:
            doc = [*head, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "New text. " * 300}]
            r = await c.post("/v1/chat/completions", json=chat(doc))
        finally:
            task.cancel()
        assert r.status_code == 200 and r.headers["x-continuum-backend"] == "b"
        on_path = seen[:3]  # 1, 4 and 16 pieces reach past the held head; the rest is off the path
        assert len(on_path) == 3 and on_path[0] < on_path[1] < on_path[2]


async def test_on_path_encodes_the_whole_prompt_before_routing(
    nats_server: NatsServer, tokenizer_files: TokenizerFiles
) -> None:
    async with (
        running_stubs("a", "b") as stubs,
        ingress(config(stubs, nats_server.url, tokenizer_files, tokenize_unheld_text="on_path")) as (ing, c),
    ):
        r = await c.post("/v1/chat/completions", json=chat([{"role": "user", "content": "Fresh text. " * 800}]))
        assert r.status_code == 200
        assert sample(ing, "continuum_kv_local_encoding_total", group="fleet", how="whole") == 1
        assert sample(ing, "continuum_kv_local_encoding_total", group="fleet", how="held") == 0
