"""The simulated engine with a real Hugging Face tokenizer (`--tokenizer`), over real HTTP and ZMQ:
its /tokenize is LocalTokenizer's encoding of the rendered chat, and the block hashes of its KV
events are the ones PromptEncoder computes for the same request — the contract precise-mode
routing rests on."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import pytest_asyncio
import zmq
import zmq.asyncio

from continuum_common.hashing.blocks import make_block_hasher
from continuum_common.tokenization import LocalTokenizer, PromptEncoder
from continuum_sim import EngineConfig, SimFleet
from continuum_sim.errors import SimError
from continuum_sim.hf_tokenizer import TokenizerFiles, train_tokenizer
from continuum_sim.protocol.generation import TextGenerator
from continuum_sim.protocol.tokenizer import Tokenizer

BLOCK = 16
RECV_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> TokenizerFiles:
    return train_tokenizer(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def local(files: TokenizerFiles) -> LocalTokenizer:
    return LocalTokenizer(files.tokenizer, chat_template=files.chat_template)


def hf_config(files: TokenizerFiles, **changes: Any) -> EngineConfig:
    base = EngineConfig(
        tokenizer=str(files.tokenizer), chat_template=str(files.chat_template), num_gpu_blocks=8192, max_model_len=16384
    )
    return replace(base, kv_events=replace(base.kv_events, topic="kv"), **changes)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fleet(files: TokenizerFiles) -> AsyncIterator[SimFleet]:
    async with SimFleet(config=hf_config(files), time_scale=0.001) as f:
        yield f


@pytest_asyncio.fixture(loop_scope="session")
async def http(fleet: SimFleet) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=fleet.urls[0], timeout=20) as client:
        yield client


def prose(words: int, seed: int) -> str:
    builtin = Tokenizer(cache_size=0)
    return builtin.decode(TextGenerator(builtin).tokens(words, random.Random(seed)))


SYSTEM = prose(900, 1)


async def test_tokenize_detokenize_and_usage_follow_the_hf_tokenizer(
    http: httpx.AsyncClient, local: LocalTokenizer, fleet: SimFleet
) -> None:
    assert fleet.endpoints[0].tokenizer == str(local.path)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is the café? 😀"}]
    text = local.render_chat(messages)
    expected = local.encode(text, add_special_tokens=False)  # the whole text, no piecewise tricks
    body = (await http.post("/tokenize", json={"messages": messages, "return_token_strs": True})).json()
    assert body["tokens"] == expected and body["count"] == len(expected)
    assert body["token_strs"][:2] == ["<|im_start|>", "system"]
    detok = (await http.post("/detokenize", json={"tokens": body["tokens"]})).json()
    assert detok["prompt"] == text
    plain = (await http.post("/tokenize", json={"prompt": "Hello world"})).json()
    assert plain["tokens"] == local.encode("Hello world", add_special_tokens=True)
    bad = await http.post("/detokenize", json={"tokens": [local.vocab_size]})
    assert bad.status_code == 400 and "vocabulary" in bad.json()["error"]["message"]

    out = (await http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 40})).json()
    assert out["usage"]["prompt_tokens"] == len(expected) and out["usage"]["completion_tokens"] == 40
    answer = out["choices"][0]["message"]["content"]
    assert answer[:1].isupper() and len(answer.split()) >= 10  # English-like words
    # The answer re-tokenizes to its own ids (all but possibly a word cut at max_tokens).
    assert abs(len(local.encode(answer, add_special_tokens=False)) - 40) <= 2


async def test_next_turn_hits_the_blocks_cached_while_decoding(http: httpx.AsyncClient) -> None:
    messages: list[dict[str, str]] = [{"role": "system", "content": prose(300, 7)}, {"role": "user", "content": "One?"}]
    first = (await http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 64})).json()
    messages += [first["choices"][0]["message"], {"role": "user", "content": "Two?"}]
    messages[-2] = {"role": "assistant", "content": messages[-2]["content"]}
    second = (await http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 8})).json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Everything up to the answer's last full block was cached (prompt and decoded blocks).
    assert cached >= first["usage"]["prompt_tokens"] + 64 - 2 * BLOCK


async def collect_stored(sub: zmq.asyncio.Socket, stop: asyncio.Event) -> list[dict[str, Any]]:
    stored: list[dict[str, Any]] = []
    while True:
        try:
            _topic, _seq, payload = await asyncio.wait_for(sub.recv_multipart(), 0.5)
        except TimeoutError:
            if stop.is_set():
                return stored
            continue
        stored += [e for e in msgpack.unpackb(payload)[1] if e["type"] == "BlockStored"]


@pytest.mark.parametrize("salt", [None, "tenant-a"])
async def test_kv_event_hashes_equal_prompt_encoder_hashes(
    files: TokenizerFiles, local: LocalTokenizer, salt: str | None
) -> None:
    """A multi-turn conversation through a fresh engine: every full block of every prompt, as
    PromptEncoder hashes it, was announced by the engine with exactly that hash."""
    encoder = PromptEncoder(local, make_block_hasher("vllm", BLOCK, hash_seed="0"))
    assert encoder.piecewise, encoder.support.reason
    ctx = zmq.asyncio.Context()
    async with SimFleet(config=hf_config(files), time_scale=0.001) as fleet:
        endpoint = fleet.endpoints[0]
        assert endpoint.kv_events_endpoint
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint.kv_events_endpoint)
        stop = asyncio.Event()
        collector = asyncio.create_task(collect_stored(sub, stop))
        await asyncio.sleep(0.3)  # the subscription reaches the PUB (slow joiner)
        expected: list[list[int]] = []
        try:
            async with httpx.AsyncClient(base_url=endpoint.url, timeout=20) as http:
                messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
                for turn in range(4):
                    messages.append({"role": "user", "content": prose(40 + 30 * turn, 100 + turn)})
                    body: dict[str, Any] = {"messages": messages, "max_tokens": 48}
                    if salt:
                        body["cache_salt"] = salt
                    out = (await http.post("/v1/chat/completions", json=body)).json()
                    prompt = encoder.encode(local.render_chat(messages), add_special_tokens=False, cache_salt=salt)
                    assert prompt.token_count == out["usage"]["prompt_tokens"]
                    expected.append(prompt.block_hashes)
                    messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
            await asyncio.sleep(0.3)
        finally:
            stop.set()
            stored = await collector
            sub.close()
            ctx.destroy(linger=0)
    announced = {h for e in stored for h in e["block_hashes"]}
    first_event = stored[0]
    assert first_event["parent_block_hash"] is None
    assert first_event["block_hashes"] == expected[0][: len(first_event["block_hashes"])]
    for chain in expected:
        assert len(chain) >= 10 and set(chain) <= announced
    if salt:
        assert first_event["extra_keys"][0] == [salt]


async def test_process_fleet_passes_the_tokenizer_to_the_child(files: TokenizerFiles, local: LocalTokenizer) -> None:
    async with SimFleet(config=hf_config(files), process=True, time_scale=0.01) as fleet:
        assert fleet.endpoints[0].chat_template == str(files.chat_template)
        async with httpx.AsyncClient(base_url=fleet.urls[0], timeout=20) as http:
            messages = [{"role": "user", "content": "Is the cache warm?"}]
            body = (await http.post("/tokenize", json={"messages": messages})).json()
    assert body["tokens"] == local.encode(local.render_chat(messages), add_special_tokens=False)


async def test_the_model_directory_template_is_the_default(files: TokenizerFiles) -> None:
    async with SimFleet(config=replace(hf_config(files), chat_template=None), time_scale=0.01) as fleet:
        assert fleet.endpoints[0].chat_template == str(files.chat_template)  # chat_template.jinja beside it


async def test_sim_reset_forgets_the_tokenizations_and_the_front_time_is_reported(
    files: TokenizerFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reset engine tokenizes again what it tokenized before (a router benchmarked after
    another must not get its prompts' tokenizations for free), and /metrics reports the time
    spent before the engine's clock starts."""
    async with (
        SimFleet(config=hf_config(files), time_scale=0.001) as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0], timeout=20) as http,
    ):
        tokenizer = fleet.engines[0].codec.tokenizer  # type: ignore[attr-defined]
        calls: list[str] = []
        encode = tokenizer.encode
        monkeypatch.setattr(tokenizer, "encode", lambda text, **kw: calls.append(text) or encode(text, **kw))
        body = {"prompt": "The shared manual says the cache is warm. " * 40, "max_tokens": 2}
        for _ in range(2):
            assert (await http.post("/v1/completions", json=body)).status_code == 200
        assert len(calls) == 1, "the second request's prompt came from the span cache"
        assert (await http.post("/sim/reset")).status_code == 200
        assert (await http.post("/v1/completions", json=body)).status_code == 200
        assert len(calls) == 2, "after a reset the prompt is tokenized again"
        metrics = (await http.get("/metrics")).text
        count = next(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("continuum_sim_request_front_seconds_count")
        )
        assert count == 3


async def test_bad_tokenizer_files_fail_clearly(tmp_path: Path, files: TokenizerFiles) -> None:
    with pytest.raises(SimError, match="tokenizer file not found"):
        async with SimFleet(config=replace(hf_config(files), tokenizer=str(tmp_path / "nope.json"))):
            pass
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for %}")
    with pytest.raises(SimError, match="does not parse"):
        async with SimFleet(config=replace(hf_config(files), chat_template=str(broken))):
            pass
    with pytest.raises(SimError, match="needs a tokenizer"):
        EngineConfig(chat_template=str(broken))


async def test_a_refusing_template_is_a_400_and_the_engine_keeps_serving(tmp_path: Path, files: TokenizerFiles) -> None:
    template = tmp_path / "strict.jinja"
    template.write_text(
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
    )
    async with (
        SimFleet(config=replace(hf_config(files), chat_template=str(template)), time_scale=0.001) as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0], timeout=20) as http,
    ):
        bad = await http.post("/v1/chat/completions", json={"messages": [{"role": "tool", "content": "x"}]})
        assert bad.status_code == 400 and "no tools here" in bad.json()["error"]["message"]
        good = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert good.status_code == 200


def test_cli_runs_with_a_tokenizer_and_rejects_a_missing_one(tmp_path: Path, files: TokenizerFiles) -> None:
    info = tmp_path / "info.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "continuum_sim", "--base-port", "0", "--zmq-base-port", "0", "--info-file", str(info),
         "--tokenizer", str(files.tokenizer), "--chat-template", str(files.chat_template)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        for _ in range(300):
            if info.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        engines = json.loads(info.read_text())["engines"]
        assert engines[0]["tokenizer"] == str(files.tokenizer)
        with httpx.Client(base_url=engines[0]["url"], timeout=10) as http:
            assert http.post("/tokenize", json={"prompt": "<|im_end|>"}).json()["tokens"] == [2]
    finally:
        proc.terminate()
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()
    missing = subprocess.run(
        [sys.executable, "-m", "continuum_sim", "--base-port", "0", "--zmq-base-port", "0",
         "--tokenizer", str(tmp_path / "missing.json")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode != 0 and "tokenizer file not found" in missing.stderr
