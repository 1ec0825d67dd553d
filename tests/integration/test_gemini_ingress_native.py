"""`type: gemini` backends with the context cache off: the native generateContent dialect
(`prefer_native_api: true`) converts both ways, and the disabled feature creates nothing (no
bus connection, no component, no metric). The openai SDK is the client, the fake Gemini API the
backend, the ingress real on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest

from continuum_common.procs import free_port
from continuum_ingress.gemini.context_cache import GeminiContextCache
from continuum_testing.fake_gemini import FakeGemini, Op
from continuum_testing.fake_gemini_bodies import google_error
from continuum_testing.gemini_cache import API_KEY, KEY_ENV, MODEL, system_prompt
from continuum_testing.gemini_ingress_stack import ADMIN_ENV, ADMIN_TOKEN, stack_config
from continuum_testing.ingress_harness import RunningIngress, running_ingress

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    yield


@contextlib.asynccontextmanager
async def _native(**cache: Any) -> AsyncIterator[tuple[FakeGemini, RunningIngress, openai.AsyncOpenAI]]:
    async with FakeGemini(api_keys={API_KEY}) as fake:
        config = stack_config(fake.url, "nats://127.0.0.1:1", enabled=False, prefer_native_api=True, **cache)
        async with running_ingress(config) as ingress:
            client = openai.AsyncOpenAI(base_url=f"{ingress.url}/v1", api_key="client-key", max_retries=0)
            try:
                yield fake, ingress, client
            finally:
                await client.close()


async def test_native_request_and_answer_conversion() -> None:
    async with _native() as (fake, _, client):
        fake.implicit_cached_tokens = 5  # Gemini 2.5 implicit caching is reported the same way
        answer = await client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Weather?"},
            ],
            temperature=0.2,
            top_p=0.9,
            max_completion_tokens=64,
            stop="END",
            seed=7,
            response_format={"type": "json_object"},
        )
        (call,) = fake.calls_for(Op.GENERATE)
        assert call.path == f"/v1beta/models/{MODEL}:generateContent" and call.api_key == API_KEY
        assert call.body == {
            "contents": [
                {"role": "user", "parts": [{"text": "Hi"}, {"text": "there"}]},
                {"role": "model", "parts": [{"text": "Hello."}]},
                {"role": "user", "parts": [{"text": "Weather?"}]},
            ],
            "systemInstruction": {"parts": [{"text": "Be brief."}]},
            "generationConfig": {
                "temperature": 0.2,
                "topP": 0.9,
                "seed": 7,
                "maxOutputTokens": 64,
                "stopSequences": ["END"],
                "responseMimeType": "application/json",
            },
        }
        assert answer.object == "chat.completion" and answer.model == MODEL
        assert answer.choices[0].message.content == fake.reply_text
        assert answer.choices[0].finish_reason == "stop"
        assert answer.usage.prompt_tokens_details.cached_tokens == 5


async def test_native_tool_calls_both_ways() -> None:
    async with _native() as (fake, _, client):
        fake.reply_function_call = {"name": "get_weather", "args": {"city": "Paris"}}
        messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
        answer = await client.chat.completions.create(
            model=MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice="required"
        )
        sent = fake.calls_for(Op.GENERATE)[-1].body
        assert sent["tools"] == [
            {
                "functionDeclarations": [
                    {
                        "name": "get_weather",
                        "description": "Weather of a city",
                        "parametersJsonSchema": WEATHER_TOOL["function"]["parameters"],
                    }
                ]
            }
        ]
        assert sent["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}

        # The tool's answer goes back as a functionResponse named after the call.
        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
        ]
        fake.reply_function_call = None
        final = await client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
        contents = fake.calls_for(Op.GENERATE)[-1].body["contents"]
        assert contents[1] == {
            "role": "model",
            "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}],
        }
        assert contents[2] == {
            "role": "user",
            "parts": [{"functionResponse": {"name": "get_weather", "response": {"temp": 21}}}],
        }
        assert final.choices[0].message.content == fake.reply_text


async def test_native_stream_tool_call_chunks() -> None:
    async with _native() as (fake, _, client):
        fake.reply_function_call = {"name": "get_weather", "args": {"city": "Oslo"}}
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=[WEATHER_TOOL],
            stream=True,
        )
        chunks = [c async for c in stream]
        calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "get_weather"
        assert json.loads(calls[0].function.arguments) == {"city": "Oslo"}
        assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_native_errors_in_openai_shape() -> None:
    async with _native() as (fake, _, client):
        fake.inject(
            Op.GENERATE, 400, body=google_error(400, "Request contains an invalid argument.", "INVALID_ARGUMENT")
        )
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        assert bad.value.code == "invalid_argument" and "invalid argument" in bad.value.message
        # What the native API cannot express is refused before it reaches Google.
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], logit_bias={"1": 5}
            )
        assert refused.value.param == "logit_bias"
        assert fake.count(Op.GENERATE) == 1
        # A stream request refused by Google gets the error in OpenAI's shape too.
        fake.inject(Op.STREAM_GENERATE, 429)
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True)


@contextlib.asynccontextmanager
async def _listener() -> AsyncIterator[tuple[str, list[int]]]:
    """A plain TCP listener standing in for NATS: it records connection attempts."""
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        writer.close()

    port = free_port()
    server = await asyncio.start_server(on_connect, "127.0.0.1", port)
    try:
        yield f"nats://127.0.0.1:{port}", accepted
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("native", [False, True], ids=["compat", "native"])
async def test_disabled_feature_creates_nothing(native: bool) -> None:
    async with FakeGemini(api_keys={API_KEY}) as fake, _listener() as (bus_url, accepted):
        config = stack_config(fake.url, bus_url, enabled=False, prefer_native_api=native)
        async with running_ingress(config) as ingress:
            client = openai.AsyncOpenAI(base_url=f"{ingress.url}/v1", api_key="k", max_retries=0)
            answer = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "system", "content": system_prompt(9)}, {"role": "user", "content": "hi"}],
            )
            await client.close()
            assert answer.choices[0].message.content == fake.reply_text
            assert fake.count(Op.GENERATE if native else Op.OPENAI_CHAT) == 1
            app = ingress.app
            assert app.gemini.cache is None and app.gemini.components == ()
            assert not any(isinstance(c, GeminiContextCache) for c in app.components)
            assert not any(isinstance(r, GeminiContextCache) for r in app.forwarder.rewriters)
            headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
            async with httpx.AsyncClient(base_url=ingress.url, headers=headers) as http:
                assert "gemini" not in (await http.get("/metrics")).text
                stats = (await http.get("/admin/gemini-context-cache/stats")).json()
                clear = (await http.post("/admin/gemini-context-cache/clear")).json()
        assert clear == {"success": False, "error": "Gemini context cache is not enabled"}
        assert stats["enabled"] is False and stats["success"] is False
        await asyncio.sleep(0.05)
        assert accepted == []  # no connection to the bus was ever attempted


async def test_enabled_without_a_reachable_bus_still_serves() -> None:
    """The same setup enabled: the ingress tries the bus (so the test above can fail), cannot
    speak to it, and serves every request uncached."""
    async with FakeGemini(api_keys={API_KEY}) as fake, _listener() as (bus_url, accepted):
        config = stack_config(fake.url, bus_url, enabled=True, lookup_timeout_ms=20)
        config["bus"]["connect_timeout_ms"] = 300
        async with running_ingress(config) as ingress:
            client = openai.AsyncOpenAI(base_url=f"{ingress.url}/v1", api_key="k", max_retries=0)
            messages = [{"role": "system", "content": system_prompt(10)}, {"role": "user", "content": "hi"}]
            answer = await client.chat.completions.create(model=MODEL, messages=messages)
            await client.close()
            assert answer.choices[0].message.content == fake.reply_text
            assert accepted
            headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
            async with httpx.AsyncClient(base_url=ingress.url, headers=headers) as http:
                stats = await http.get("/admin/gemini-context-cache/stats")
                metrics = (await http.get("/metrics")).text
        assert stats.status_code == 503 and stats.json()["success"] is False
        assert 'continuum_ingress_gemini_context_cache_requests_total{backend="gem-a",result="miss"} 1.0' in metrics


async def test_responses_api_is_converted_to_native_gemini() -> None:
    """Google's compat API has no /responses: the ingress converts (default compat mode too)."""
    async with FakeGemini(api_keys={API_KEY}) as fake:
        config = stack_config(fake.url, "nats://127.0.0.1:1", enabled=False)
        async with running_ingress(config) as ingress:
            client = openai.AsyncOpenAI(base_url=f"{ingress.url}/v1", api_key="k", max_retries=0)
            fake.implicit_cached_tokens = 3
            response = await client.responses.create(
                model=MODEL, instructions="Be brief.", input="Hello", max_output_tokens=50, temperature=0
            )
            (call,) = fake.calls_for(Op.GENERATE)
            assert call.body == {
                "contents": [{"role": "user", "parts": [{"text": "Hello"}]}],
                "systemInstruction": {"parts": [{"text": "Be brief."}]},
                "generationConfig": {"temperature": 0, "maxOutputTokens": 50},
            }
            assert response.status == "completed" and response.output_text == fake.reply_text
            assert response.usage is not None and response.usage.input_tokens_details.cached_tokens == 3

            fake.reply_function_call = {"name": "get_weather", "args": {"city": "Rome"}}
            tool = {"type": "function", **WEATHER_TOOL["function"]}
            called = await client.responses.create(model=MODEL, input="Weather in Rome?", tools=[tool])  # type: ignore[list-item]
            (item,) = called.output
            assert item.type == "function_call" and item.name == "get_weather"
            assert json.loads(item.arguments) == {"city": "Rome"}
            fake.reply_function_call = None
            follow = await client.responses.create(
                model=MODEL,
                input=[
                    {"role": "user", "content": "Weather in Rome?"},
                    {"type": "function_call", "call_id": item.call_id, "name": item.name, "arguments": item.arguments},
                    {"type": "function_call_output", "call_id": item.call_id, "output": '{"temp": 25}'},
                ],
                tools=[tool],  # type: ignore[list-item]
            )
            contents = fake.calls_for(Op.GENERATE)[-1].body["contents"]
            assert contents[2]["parts"] == [{"functionResponse": {"name": "get_weather", "response": {"temp": 25}}}]
            assert follow.output_text == fake.reply_text

            stream = await client.responses.create(model=MODEL, input="Stream it", stream=True)
            events = [e async for e in stream]
            await client.close()
        kinds = [e.type for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == fake.reply_text
        done = events[-1].response
        assert done.output_text == fake.reply_text and done.usage.input_tokens_details.cached_tokens == 3
