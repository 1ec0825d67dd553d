"""The simulated engine tokenizes prompts off its event loop with a Hugging Face tokenizer, as
vLLM's API server does: over real HTTP, the engine keeps answering while a prompt's
tokenization is held up on the worker thread, and the prompt's ids are the tokenizer's."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import replace

import httpx
import pytest
import pytest_asyncio
import zmq.asyncio

from continuum_common.tokenization import LocalTokenizer, UnlockedTokenizer
from continuum_sim import EngineConfig
from continuum_sim.adapters.prompt_tokens import PromptTokens
from continuum_sim.app import SimEngineServer
from continuum_sim.hf_tokenizer import TokenizerFiles, train_tokenizer
from continuum_sim.protocol.codec import BuiltinCodec, HfCodec
from continuum_sim.protocol.tokenizer import Tokenizer

GATE = "zebra-gate"  # a prompt holding this word waits in the tokenizer until released
WAIT_S = 10.0
WATCH = (GATE, "station", "morning")


class GatedTokenizer(UnlockedTokenizer):
    """Records the thread of every encode of a text holding a word of `WATCH` (the engine's
    answer generator encodes words of its own on the loop); one holding GATE waits for
    `release`."""

    def __init__(self, files: TokenizerFiles) -> None:
        super().__init__(files.tokenizer, chat_template=files.chat_template)
        self.threads: list[int] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.gave_up = False

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        if any(word in text for word in WATCH):
            self.threads.append(threading.get_ident())
        if GATE in text:
            self.entered.set()
            if not self.release.wait(WAIT_S):
                self.gave_up = True  # nobody released it: the loop was held
        return super().encode(text, add_special_tokens=add_special_tokens)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> TokenizerFiles:
    return train_tokenizer(tmp_path_factory.mktemp("hf"))


@pytest_asyncio.fixture
async def gated(files: TokenizerFiles) -> AsyncIterator[tuple[SimEngineServer, GatedTokenizer]]:
    tokenizer = GatedTokenizer(files)
    config = EngineConfig(tokenizer=str(files.tokenizer), chat_template=str(files.chat_template))
    config = replace(config, kv_events=replace(config.kv_events, enabled=False))
    context = zmq.asyncio.Context()
    server = SimEngineServer(config, HfCodec(tokenizer), context)
    await server.start()
    try:
        yield server, tokenizer
    finally:
        tokenizer.release.set()
        await server.stop()
        context.destroy(linger=0)


def long_prompt(words: int) -> str:
    return " ".join(f"word{i % 97}" for i in range(words)) + f" {GATE} and the end."


async def test_the_engine_serves_while_a_prompt_is_tokenized(
    gated: tuple[SimEngineServer, GatedTokenizer], files: TokenizerFiles
) -> None:
    server, tokenizer = gated
    prompt = long_prompt(3000)
    async with httpx.AsyncClient(base_url=server.endpoints.url, timeout=WAIT_S + 10) as http:
        body = {"model": server.config.model, "prompt": prompt, "max_tokens": 4}
        completion = asyncio.create_task(http.post("/v1/completions", json=body))
        for _ in range(500):
            if tokenizer.entered.is_set():
                break
            await asyncio.sleep(0.01)
        assert tokenizer.entered.is_set(), "the prompt never reached the tokenizer"
        # the prompt is still being tokenized: the engine answers other requests meanwhile
        health = await http.get("/health", timeout=WAIT_S / 2)
        models = await http.get("/v1/models", timeout=WAIT_S / 2)
        assert health.status_code == 200 and models.status_code == 200
        assert not completion.done()
        tokenizer.release.set()
        resp = await completion
    assert resp.status_code == 200, resp.text
    assert not tokenizer.gave_up
    plain = LocalTokenizer(files.tokenizer, chat_template=files.chat_template)
    assert resp.json()["usage"]["prompt_tokens"] == len(plain.encode(prompt, add_special_tokens=True))
    assert tokenizer.threads and threading.get_ident() not in tokenizer.threads  # on the worker


async def test_chat_and_tokenize_go_through_the_worker_too(gated: tuple[SimEngineServer, GatedTokenizer]) -> None:
    server, tokenizer = gated
    messages = [{"role": "user", "content": "Where is the station?"}]
    async with httpx.AsyncClient(base_url=server.endpoints.url, timeout=10) as http:
        chat = await http.post("/v1/chat/completions", json={"model": server.config.model, "messages": messages})
        tok = await http.post("/tokenize", json={"model": server.config.model, "messages": messages})
        other = [{"role": "user", "content": "Where is the station, please?"}]  # not in the span cache
        tok2 = await http.post("/tokenize", json={"model": server.config.model, "messages": other})
    assert chat.status_code == 200 and tok.status_code == 200 and tok2.status_code == 200
    assert chat.json()["usage"]["prompt_tokens"] == tok.json()["count"] < tok2.json()["count"]
    assert len(tokenizer.threads) == 2
    assert threading.get_ident() not in tokenizer.threads


async def test_the_builtin_tokenizer_and_a_closed_worker_stay_on_the_loop(files: TokenizerFiles) -> None:
    builtin = PromptTokens(BuiltinCodec(Tokenizer()), "e0")
    assert not builtin.off_loop
    assert await builtin.encode("good night", add_special_tokens=True) == Tokenizer().encode("good night")
    builtin.close()

    tokenizer = GatedTokenizer(files)
    prompts = PromptTokens(HfCodec(tokenizer), "e1")
    assert prompts.off_loop
    await prompts.encode("a morning", add_special_tokens=False)
    assert tokenizer.threads[-1] != threading.get_ident()
    prompts.close()
    assert not prompts.off_loop
    ids = await prompts.encode("good morning", add_special_tokens=False)  # not in the span cache
    assert tokenizer.threads[-1] == threading.get_ident()
    assert ids == tokenizer.encode("good morning", add_special_tokens=False)
