"""The simulated engine's OpenAI Responses API over loopback HTTP, driven by the official openai
SDK (non-stream and typed stream events) and by raw requests for the errors."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import pytest_asyncio

from continuum_common.hashing.responses_input import responses_messages
from continuum_sim import SimFleet

MODEL = "continuum-sim-8b"
HANDBOOK = "You answer questions about the attached handbook. " * 40


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(1, time_scale=0.001) as f:
        yield f


@pytest_asyncio.fixture(loop_scope="session")
async def oai(fleet: SimFleet) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(api_key="sk-test", base_url=fleet.endpoints[0].openai_base_url, max_retries=0) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="session")
async def http(fleet: SimFleet) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        yield client


async def test_a_response_and_its_next_turn_report_the_cached_prompt(oai: openai.AsyncOpenAI) -> None:
    first = await oai.responses.create(
        model=MODEL, instructions=HANDBOOK, input="What is chapter one about?", max_output_tokens=12
    )
    assert first.object == "response" and first.id.startswith("resp_")
    assert first.status == "incomplete" and first.incomplete_details is not None  # 12 tokens: cut
    assert first.incomplete_details.reason == "max_output_tokens"
    assert first.output_text and first.output[0].type == "message"
    assert first.usage is not None and first.usage.output_tokens == 12
    assert first.usage.input_tokens_details.cached_tokens == 0
    # The next turn: the conversation so far as input items, the answer as an assistant message.
    turn = [
        {"role": "user", "content": "What is chapter one about?"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
        {"role": "user", "content": [{"type": "input_text", "text": "And chapter two?"}]},
    ]
    second = await oai.responses.create(model=MODEL, instructions=HANDBOOK, input=turn, max_output_tokens=12)  # type: ignore[arg-type]
    assert second.usage is not None
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached > 0 and cached % 16 == 0
    assert cached >= first.usage.input_tokens - 16  # all the first turn's full blocks


async def test_the_prompt_is_the_chat_templated_conversation(oai: openai.AsyncOpenAI, http: httpx.AsyncClient) -> None:
    """Hash-exact with the ingress: the engine's prompt is the chat template over the messages
    continuum_common derives, so /tokenize of those messages gives the same token count."""
    body = {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": "Name a colour."},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "blue"},
        ],
        "max_output_tokens": 4,
    }
    answer = await oai.responses.create(**body)  # type: ignore[arg-type]
    tokenized = await http.post("/tokenize", json={"model": MODEL, "messages": responses_messages(body)})
    assert tokenized.status_code == 200
    assert answer.usage is not None and answer.usage.input_tokens == tokenized.json()["count"]


async def test_a_streamed_response_sends_the_typed_events_in_order(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.responses.create(model=MODEL, input="Stream a short answer.", max_output_tokens=20, stream=True)
    kinds: list[str] = []
    numbers: list[int] = []
    text = ""
    final = None
    async for event in stream:
        kinds.append(event.type)
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert numbers == list(range(len(kinds)))
    assert final is not None and final.output_text == text and text
    assert final.usage is not None and final.usage.output_tokens == 20


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 3}]}]}, "input[0].content[0].text"),
        ({"input": ["hi"]}, "input[0]"),
        ({"input": []}, "input"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "instructions": 5}, "instructions"),
    ],
)
async def test_bad_responses_requests_get_error_bodies(
    http: httpx.AsyncClient, body: dict[str, object], param: str
) -> None:
    reply = await http.post("/v1/responses", json={"model": MODEL, **body})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param
    # The engine keeps serving.
    ok = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2})
    assert ok.status_code == 200 and ok.json()["status"] == "incomplete"
