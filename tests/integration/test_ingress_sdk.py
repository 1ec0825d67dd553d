"""The official openai and anthropic SDKs against the ingress over real HTTP (stream and not)."""

from __future__ import annotations

import anthropic
import openai
import pytest

from continuum_testing.ingress_harness import running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs

SYSTEM = "You are a careful assistant."


# Every SDK client is closed explicitly: a client left to the garbage collector closes its
# sockets at collection and then, from a task scheduled by __del__, aborts their transports,
# which unregisters whatever socket has reused the file descriptor in the meantime (seen: a
# simulated engine's listening socket in a later test, which then never accepted again).


async def test_openai_sdk_every_endpoint() -> None:
    async with running_stubs("v1") as stubs, running_ingress({"backends": stub_backends(stubs)}) as ing:
        client = openai.AsyncOpenAI(api_key="sk-test", base_url=f"{ing.url}/v1", max_retries=0)
        chat = await client.chat.completions.create(
            model="m", messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
        )
        assert chat.choices[0].message.content == "hello from v1"
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
        assert "".join(pieces) == "hello from v1"
        completion = await client.completions.create(model="m", prompt="say hi")
        assert completion.choices[0].text == "hello from v1"
        cstream = await client.completions.create(model="m", prompt="say hi", stream=True)
        assert "".join([c.choices[0].text async for c in cstream]) == "hello from v1"
        # The SDK asks for base64 by default and decodes it.
        emb = await client.embeddings.create(model="m", input=["a", "b"])
        assert [d.embedding for d in emb.data] == [[0.25, -0.5, 1.0]] * 2
        assert stubs[0].stub.requests[-1].body["encoding_format"] == "base64"
        resp = await client.responses.create(model="m", input="hi")
        assert resp.output_text == "hello from v1"
        models = await client.models.list()
        assert [m.id for m in models.data] == ["m"]
        assert (await client.models.retrieve("m")).id == "m"
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("other")
        paths = [r.path for r in stubs[0].stub.requests]
        assert paths == [
            "/v1/chat/completions",
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/responses",
        ]
        # The caller's key reaches a backend that has none of its own.
        assert stubs[0].stub.requests[0].headers["authorization"] == "Bearer sk-test"
        await client.close()


async def test_openai_sdk_sees_provider_shaped_errors() -> None:
    async with running_stubs("v1") as stubs, running_ingress({"backends": stub_backends(stubs)}) as ing:
        client = openai.AsyncOpenAI(api_key="sk-test", base_url=f"{ing.url}/v1", max_retries=0)
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], temperature=7)
        assert bad.value.param == "temperature" and bad.value.code == "invalid_value"
        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
        assert missing.value.code == "model_not_found"
        assert stubs[0].stub.requests == []
        await client.close()


@pytest.mark.parametrize("backend_type", ["anthropic", "vllm"])
async def test_anthropic_sdk_native_and_vllm_messages(backend_type: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTINUUM_TEST_ANTHROPIC_KEY", "sk-ant-backend")
    extra = {"api_key_env": "CONTINUUM_TEST_ANTHROPIC_KEY"} if backend_type == "anthropic" else {}
    backends = stub_backends_for(backend_type, extra)
    async with running_stubs("claude") as stubs, running_ingress({"backends": backends(stubs)}) as ing:
        client = anthropic.AsyncAnthropic(api_key="ak-client", base_url=f"{ing.url}/anthropic", max_retries=0)
        msg = await client.messages.create(
            model="m", max_tokens=16, system=SYSTEM, messages=[{"role": "user", "content": "hi"}]
        )
        assert msg.content[0].text == "hello from claude"  # type: ignore[union-attr]
        async with client.messages.stream(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as st:
            text = "".join([t async for t in st.text_stream])
            final = await st.get_final_message()
        assert text == "hello from claude" and final.stop_reason == "end_turn"
        await client.close()
        first = stubs[0].stub.requests[0]
        assert first.path == "/v1/messages"
        # SDK >= 2 sends Bearer + 2026-10-21; the version travels on.
        assert first.headers["anthropic-version"] == "2026-10-21"
        if backend_type == "anthropic":
            assert first.headers["x-api-key"] == "sk-ant-backend" and "authorization" not in first.headers
        else:
            assert first.headers["authorization"] == "Bearer ak-client"


def stub_backends_for(backend_type: str, extra: dict[str, object]):  # type: ignore[no-untyped-def]
    return lambda stubs: stub_backends(stubs, type=backend_type, **extra)


async def test_anthropic_old_sdk_headers_are_accepted() -> None:
    async with (
        running_stubs("claude") as stubs,
        running_ingress({"backends": stub_backends(stubs, type="anthropic")}) as ing,
    ):
        client = anthropic.AsyncAnthropic(
            api_key="ak-old",
            base_url=f"{ing.url}/anthropic",
            max_retries=0,
            default_headers={
                "anthropic-version": "2023-06-01",
                "x-api-key": "ak-old",
                "Authorization": anthropic.Omit(),
            },
        )
        msg = await client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert msg.content[0].text == "hello from claude"  # type: ignore[union-attr]
        sent = stubs[0].stub.requests[0].headers
        assert sent["x-api-key"] == "ak-old" and sent["anthropic-version"] == "2023-06-01"
        with pytest.raises(anthropic.BadRequestError) as bad:
            await client.messages.create(model="m", max_tokens=8, messages=[])  # type: ignore[arg-type]
        assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model="other", max_tokens=8, messages=[{"role": "user", "content": "x"}])
        assert len(stubs[0].stub.requests) == 1
        await client.close()


async def test_gemini_backends_use_the_openai_compatible_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTINUUM_TEST_GEMINI_KEY", "goog-key")
    async with running_stubs("gem") as stubs:
        backends = stub_backends(
            stubs, type="gemini", models=["gemini-2.5-flash"], api_key_env="CONTINUUM_TEST_GEMINI_KEY"
        )
        async with running_ingress({"backends": backends}) as ing:
            client = openai.AsyncOpenAI(api_key="sk-client", base_url=f"{ing.url}/v1", max_retries=0)
            chat = await client.chat.completions.create(
                model="gemini-2.5-flash", messages=[{"role": "user", "content": "hi"}]
            )
            assert chat.choices[0].message.content == "hello from gem"
            # /v1/responses goes to the native API (converted; docs/gemini-ingress.md), which
            # this OpenAI-style stub does not serve.
            with pytest.raises(openai.NotFoundError):
                await client.responses.create(model="gemini-2.5-flash", input="hi")
            await client.close()
    sent = stubs[0].stub.requests[0]
    assert sent.path == "/v1beta/openai/chat/completions"
    assert sent.headers["authorization"] == "Bearer goog-key"  # the backend's key, not the caller's
