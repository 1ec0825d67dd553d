"""A real simulated engine over loopback HTTP, driven by the official openai and anthropic SDKs
and by raw requests for /tokenize, /detokenize, errors and /metrics."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator

import anthropic
import httpx
import numpy as np
import openai
import pytest
import pytest_asyncio

from continuum_sim import EngineConfig, SimFleet

MODEL = "continuum-sim-8b"
SYSTEM = "You answer questions about the attached handbook. " * 40


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(1, time_scale=0.001) as f:
        yield f


@pytest_asyncio.fixture(loop_scope="session")
async def http(fleet: SimFleet) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        yield client


@pytest_asyncio.fixture(loop_scope="session")
async def oai(fleet: SimFleet) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(api_key="sk-test", base_url=fleet.endpoints[0].openai_base_url, max_retries=0) as c:
        yield c


async def test_openai_chat_non_stream_reports_cached_tokens(oai: openai.AsyncOpenAI) -> None:
    client = oai
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is chapter one about?"}]
    first = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)  # type: ignore[arg-type]
    assert first.object == "chat.completion"
    assert first.choices[0].finish_reason == "length" and first.choices[0].message.role == "assistant"
    assert first.usage is not None and first.usage.completion_tokens == 12
    assert first.usage.prompt_tokens_details is not None and first.usage.prompt_tokens_details.cached_tokens == 0
    messages[1]["content"] = "And chapter two?"
    second = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)  # type: ignore[arg-type]
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached > 0 and cached % 16 == 0
    assert cached >= second.usage.prompt_tokens - 32
    again = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)  # type: ignore[arg-type]
    assert again.choices[0].message.content == second.choices[0].message.content, "deterministic output"


async def test_openai_chat_stream_with_include_usage(oai: openai.AsyncOpenAI) -> None:
    client = oai
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream a short answer."}],
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, roles = "", None, None, []
    async for chunk in stream:
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
            continue
        delta = chunk.choices[0].delta
        roles.append(delta.role)
        text += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert roles[0] == "assistant" and finish == "length"
    assert usage is not None and usage.completion_tokens == 30 and usage.prompt_tokens > 0
    plain = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Stream a short answer."}], max_tokens=30
    )
    assert plain.choices[0].message.content == text


async def test_openai_completions_models_and_embeddings(oai: openai.AsyncOpenAI) -> None:
    client = oai
    done = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
    assert done.choices[0].text and done.usage is not None and done.usage.completion_tokens == 5
    chunks = [
        c
        async for c in await client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=5, stream=True
        )
    ]
    assert "".join(c.choices[0].text for c in chunks) == done.choices[0].text
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    emb = await client.embeddings.create(
        model=MODEL,
        input=["What is the capital of France?", "What's the capital city of France?", "Bananas are yellow."],
    )
    vecs = [np.array(d.embedding) for d in emb.data]  # the SDK asked for base64 and decoded it
    assert len(vecs[0]) == 384 and abs(np.linalg.norm(vecs[0]) - 1) < 1e-5
    assert vecs[0] @ vecs[1] > 0.7 > 0.2 > vecs[0] @ vecs[2]
    floats = await client.embeddings.create(model=MODEL, input="hello", encoding_format="float", dimensions=64)
    assert len(floats.data[0].embedding) == 64


@pytest_asyncio.fixture(loop_scope="session")
async def anthropic_client(fleet: SimFleet) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(api_key="ak-test", base_url=fleet.urls[0], max_retries=0) as c:
        yield c


async def test_anthropic_messages_stream_and_non_stream(anthropic_client: anthropic.AsyncAnthropic) -> None:
    client = anthropic_client
    system = [{"type": "text", "text": SYSTEM}]
    # The system prompt's blocks are cached by this first request, whichever test ran before.
    await client.messages.create(
        model=MODEL,
        max_tokens=1,
        system=system,
        messages=[{"role": "user", "content": "Hello."}],  # type: ignore[arg-type]
    )
    msg = await client.messages.create(
        model=MODEL,
        max_tokens=8,
        system=system,
        messages=[{"role": "user", "content": "Summarise."}],  # type: ignore[arg-type]
    )
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 8
    assert (
        msg.usage.cache_read_input_tokens is not None and msg.usage.cache_read_input_tokens > 0
    )  # the system prompt cached by the request above
    async with client.messages.stream(
        model=MODEL,
        max_tokens=8,
        system=system,
        messages=[{"role": "user", "content": "Summarise."}],  # type: ignore[arg-type]
    ) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text == msg.content[0].text  # type: ignore[union-attr]
    assert final.usage.output_tokens == 8
    with pytest.raises(anthropic.BadRequestError) as err:
        await client.messages.create(model=MODEL, max_tokens=8, messages=[])
    assert err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


async def test_tokenize_and_detokenize_shapes(http: httpx.AsyncClient) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    resp = await http.post("/tokenize", json={"model": MODEL, "messages": messages, "return_token_strs": True})
    assert resp.status_code == 200
    body = resp.json()
    assert set(body) == {"count", "max_model_len", "tokens", "token_strs"}
    assert body["count"] == len(body["tokens"]) == len(body["token_strs"]) and body["max_model_len"] == 32768
    text = (await http.post("/detokenize", json={"tokens": body["tokens"]})).json()["prompt"]
    assert (
        text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "".join(body["token_strs"]) == text
    plain = (await http.post("/tokenize", json={"prompt": "Hi there"})).json()
    assert plain["token_strs"] is None and plain["count"] == len(plain["tokens"])
    open_turn = (
        await http.post(
            "/tokenize", json={"messages": messages, "add_generation_prompt": False, "continue_final_message": True}
        )
    ).json()
    assert (
        (await http.post("/detokenize", json={"tokens": open_turn["tokens"]}))
        .json()["prompt"]
        .endswith("user\nHi there")
    )


def _sse(body: str) -> list[dict[str, object]]:
    import json

    return [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:") and "[DONE]" not in line]


async def test_return_token_ids_as_vllm_shapes_them(http: httpx.AsyncClient) -> None:
    """vLLM's `return_token_ids`: the prompt's ids are what /tokenize gives for the same
    request; the output's ids decode to the answer's text; absent unless asked."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to five."}]
    prompt = (await http.post("/tokenize", json={"messages": messages})).json()["tokens"]
    chat = {"model": MODEL, "messages": messages, "max_tokens": 9, "return_token_ids": True}
    whole = (await http.post("/v1/chat/completions", json=chat)).json()
    assert whole["prompt_token_ids"] == prompt
    out = whole["choices"][0]["token_ids"]
    assert len(out) == 9
    assert (await http.post("/detokenize", json={"tokens": out})).json()["prompt"] == whole["choices"][0]["message"][
        "content"
    ]
    events = _sse((await http.post("/v1/chat/completions", json={**chat, "stream": True})).text)
    assert events[0]["prompt_token_ids"] == prompt and "token_ids" not in events[0]["choices"][0]  # type: ignore[index]
    assert all("prompt_token_ids" not in e for e in events[1:])
    assert [t for e in events[1:] for t in e["choices"][0]["token_ids"]] == out  # type: ignore[index]
    plain = (await http.post("/v1/chat/completions", json={**chat, "return_token_ids": False})).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]

    text = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 7, "return_token_ids": True}
    prompt = (await http.post("/tokenize", json={"prompt": "Once upon a time"})).json()["tokens"]
    whole = (await http.post("/v1/completions", json=text)).json()
    assert whole["choices"][0]["prompt_token_ids"] == prompt and len(whole["choices"][0]["token_ids"]) == 7
    events = _sse((await http.post("/v1/completions", json={**text, "stream": True})).text)
    choices = [e["choices"][0] for e in events]  # type: ignore[index]
    assert choices[0]["prompt_token_ids"] == prompt and all(c["prompt_token_ids"] is None for c in choices[1:])
    assert [t for c in choices for t in c["token_ids"]] == whole["choices"][0]["token_ids"]


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/detokenize", {"tokens": [-1]}, 400, "between 0 and 2^63-1"),
        ("/detokenize", {"tokens": [2**63]}, 400, "between 0 and 2^63-1"),
        ("/detokenize", {"tokens": ["a"]}, 400, "must be an integer"),
        ("/detokenize", {"tokens": [True]}, 400, "must be an integer"),
        ("/detokenize", {"tokens": "1,2"}, 400, "array of integers"),
        ("/detokenize", {"tokens": [151936]}, 400, "out of vocabulary"),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True},
            400,
            "Cannot set both",
        ),
        ("/tokenize", {"nothing": 1}, 400, "required"),
        ("/tokenize", {"prompt": "x", "model": "nope"}, 404, "does not exist"),
        ("/v1/chat/completions", {"messages": []}, 400, "non-empty array"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "at least 1"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 40000},
            400,
            "maximum context length",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "cache_salt": ""}, 400, "cache_salt"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}},
            400,
            "stream=True",
        ),
        ("/v1/completions", {"prompt": {"a": 1}}, 400, "prompt"),
        ("/v1/embeddings", {"input": 5}, 400, "input"),
    ],
)
async def test_bad_requests_get_vllm_error_bodies(
    http: httpx.AsyncClient, path: str, body: object, status: int, fragment: str
) -> None:
    resp = await http.post(path, json=body)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert fragment in error["message"] and error["code"] == status and error["type"]


async def test_malformed_json_and_media_type(http: httpx.AsyncClient) -> None:
    resp = await http.post("/tokenize", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]["message"]
    resp = await http.post(
        "/tokenize", content=b"prompt=x", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert resp.status_code == 415
    assert (await http.get("/health")).status_code == 200, "still serving"


async def test_metrics_count_prefix_cache_tokens(http: httpx.AsyncClient) -> None:
    def value(text: str, name: str) -> float:
        line = next(ln for ln in text.splitlines() if ln.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    before = (await http.get("/metrics")).text
    body = {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "metrics?"}],
        "max_tokens": 4,
    }
    resp = await http.post("/v1/chat/completions", json=body)
    usage = resp.json()["usage"]
    after = (await http.get("/metrics")).text
    assert (
        value(after, "vllm:prefix_cache_queries_total") - value(before, "vllm:prefix_cache_queries_total")
        == usage["prompt_tokens"]
    )
    assert (
        value(after, "vllm:prefix_cache_hits_total") - value(before, "vllm:prefix_cache_hits_total")
        == usage["prompt_tokens_details"]["cached_tokens"]
    )
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert value(after, name) >= 0


async def test_reset_prefix_cache_drops_hits(http: httpx.AsyncClient) -> None:
    body = {
        "messages": [{"role": "system", "content": SYSTEM + "reset"}, {"role": "user", "content": "q"}],
        "max_tokens": 2,
    }
    await http.post("/v1/chat/completions", json=body)
    assert (await http.post("/v1/chat/completions", json=body)).json()["usage"]["prompt_tokens_details"][
        "cached_tokens"
    ] > 0
    assert (await http.post("/reset_prefix_cache")).status_code == 200
    assert (await http.post("/v1/chat/completions", json=body)).json()["usage"]["prompt_tokens_details"][
        "cached_tokens"
    ] == 0


def test_base64_embedding_is_little_endian_float32() -> None:
    from continuum_sim.protocol.embeddings import embed, encode_base64

    vec = embed("hello world", 16)
    assert np.allclose(np.frombuffer(base64.b64decode(encode_base64(vec)), dtype="<f4"), vec)


async def test_client_disconnect_aborts_and_frees_blocks() -> None:
    # Its own engine at time_scale 0.1: 5,000 tokens take ~2.5 s to generate, so even a busy
    # machine notices the hang-up long before the request could finish on its own.
    async with SimFleet(1, time_scale=0.1) as fleet, httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as http:
        engine = fleet.engines[0]
        body = {"prompt": "disconnect " * 300, "max_tokens": 5000, "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    break
            assert engine.pool.num_free_blocks < engine.pool.capacity
        for _ in range(250):
            if not engine.scheduler.has_work:
                break
            await asyncio.sleep(0.02)
        assert not engine.scheduler.has_work
        assert engine.pool.num_free_blocks == engine.pool.capacity, "the aborted request released its blocks"
        assert "continuum_sim_requests_aborted_total 1.0" in (await http.get("/metrics")).text


async def test_full_waiting_queue_answers_503() -> None:
    config = EngineConfig(max_waiting=1, max_num_seqs=1, num_gpu_blocks=512, max_model_len=1024)
    async with (
        SimFleet(config=config, time_scale=0.05) as small,
        httpx.AsyncClient(base_url=small.urls[0], timeout=10) as client,
    ):
        body = {"prompt": "queue test", "max_tokens": 200}
        responses = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(4)))
        codes = sorted(r.status_code for r in responses)
        assert codes[0] == 200 and 503 in codes
        busy = next(r for r in responses if r.status_code == 503)
        assert busy.json()["error"]["type"] == "ServiceUnavailableError"
        assert (await client.post("/v1/completions", json={"prompt": "after", "max_tokens": 2})).status_code == 200


async def test_request_times_stamp_requests_that_carry_an_id(http: httpx.AsyncClient) -> None:
    """GET /sim/request-times: the stamps of each streamed request sent with an `x-request-id`,
    in order on the host's monotonic clock; reading them clears them; no id, no record."""
    await http.get("/sim/request-times")  # whatever earlier tests left
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Time me."}],
        "max_tokens": 5,
        "stream": True,
    }
    before = time.monotonic()
    async with http.stream("POST", "/v1/chat/completions", json=body, headers={"x-request-id": "bench-1"}) as resp:
        assert resp.status_code == 200
        await resp.aread()
    after = time.monotonic()
    await http.post("/v1/chat/completions", json={**body, "stream": False})  # no id: not recorded
    got = (await http.get("/sim/request-times")).json()
    assert got["dropped"] == 0 and [r["id"] for r in got["requests"]] == ["bench-1"]
    stamps = got["requests"][0]
    order = [stamps[k] for k in ("head", "arrived", "submitted", "first_chunk", "first_content")]
    assert before <= order[0] and order == sorted(order) and order[-1] <= after
    assert (await http.get("/sim/request-times")).json() == {"requests": [], "dropped": 0}
