"""The simulated engine's OpenAI Responses API over loopback HTTP, driven by the official openai
SDK (non-stream and typed stream events, conversations continued with `previous_response_id`,
stored responses retrieved, listed and deleted) and by raw requests for the errors."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import pytest_asyncio

from continuum_common.hashing.responses_input import responses_messages
from continuum_sim import EngineConfig, SimFleet

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
        ({"input": "hi", "previous_response_id": 7}, "previous_response_id"),
        # Malformed is malformed on every engine: 400 before looking the id up.
        ({"input": [{"role": "robot", "content": "hi"}], "previous_response_id": "resp_1"}, "input[0].role"),
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


QUESTIONS = ("What is chapter one about?", "And chapter two?", "Which one is longer?")


async def test_previous_response_id_continues_the_stored_conversation(oai: openai.AsyncOpenAI) -> None:
    previous_id: str | None = None  # sent as null on the first turn: no earlier response
    seen: list[tuple[int, int]] = []  # (input_tokens, cached_tokens) per turn
    for question in QUESTIONS:
        # The instructions once, on the first turn: the engine keeps them in the stored
        # conversation (sent again, they would go before the history and break its prefix).
        answer = await oai.responses.create(
            model=MODEL,
            instructions=HANDBOOK if previous_id is None else None,
            input=question,
            max_output_tokens=12,
            previous_response_id=previous_id,
        )
        assert answer.status == "incomplete" and answer.output_text
        assert answer.previous_response_id == previous_id
        assert answer.usage is not None
        seen.append((answer.usage.input_tokens, answer.usage.input_tokens_details.cached_tokens))
        previous_id = answer.id
    # Each turn's prompt holds the earlier turns, and this engine has their blocks cached.
    assert seen[0][0] < seen[1][0] < seen[2][0]
    assert all(cached > 0 for _, cached in seen[1:])
    assert seen[2][1] >= seen[1][0] - 16  # all the second turn's full blocks


async def test_a_streamed_response_is_stored_under_the_id_of_response_created(oai: openai.AsyncOpenAI) -> None:
    previous_id: str | None = None
    seen: list[tuple[int, int]] = []
    for question in QUESTIONS:
        stream = await oai.responses.create(
            model=MODEL,
            instructions=HANDBOOK if previous_id is None else None,
            input=question,
            max_output_tokens=10,
            stream=True,
            previous_response_id=previous_id,
        )
        events = [event async for event in stream]
        created, final = events[0], events[-1]
        assert created.type == "response.created" and final.type == "response.incomplete"
        assert final.response.id == created.response.id and final.response.previous_response_id == previous_id
        usage = final.response.usage
        assert usage is not None
        seen.append((usage.input_tokens, usage.input_tokens_details.cached_tokens))
        previous_id = created.response.id
    assert seen[0][0] < seen[1][0] < seen[2][0]
    assert all(cached > 0 for _, cached in seen[1:])


async def test_a_continued_prompt_is_the_stored_conversation_under_the_new_instructions(
    oai: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    """As vLLM builds it: the new instructions, then the stored conversation (the earlier
    request's instructions included), then the new input."""
    first = await oai.responses.create(model=MODEL, instructions=HANDBOOK, input="Name a colour.", max_output_tokens=6)
    second = await oai.responses.create(
        model=MODEL, instructions="Be brief.", input="Another one?", max_output_tokens=6, previous_response_id=first.id
    )
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": HANDBOOK},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Another one?"},
    ]
    tokenized = await http.post("/tokenize", json={"model": MODEL, "messages": messages})
    assert second.usage is not None and second.usage.input_tokens == tokenized.json()["count"]


async def test_an_unknown_previous_response_id_is_not_found(oai: openai.AsyncOpenAI, http: httpx.AsyncClient) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        await oai.responses.create(model=MODEL, input="hi", previous_response_id="resp_never_stored")
    assert "resp_never_stored" in str(raised.value)
    reply = await http.post(
        "/v1/responses", json={"model": MODEL, "input": "hi", "previous_response_id": "resp_never_stored"}
    )
    assert reply.status_code == 404
    assert reply.json() == {
        "error": {
            "message": "Response with id 'resp_never_stored' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "response_not_found",
        }
    }


async def test_a_response_sent_with_store_false_cannot_be_continued(oai: openai.AsyncOpenAI) -> None:
    for stream in (False, True):
        if stream:
            events = [e async for e in await oai.responses.create(model=MODEL, input="hi", store=False, stream=True)]
            assert events[0].type == "response.created"
            rid = events[0].response.id
        else:
            rid = (await oai.responses.create(model=MODEL, input="hi", store=False, max_output_tokens=4)).id
        with pytest.raises(openai.NotFoundError, match=rid):
            await oai.responses.create(model=MODEL, input="and?", previous_response_id=rid)
        with pytest.raises(openai.NotFoundError, match=rid):
            await oai.responses.retrieve(rid)


async def test_an_engine_with_the_store_off_knows_no_response() -> None:
    config = EngineConfig(responses_store=0)
    async with SimFleet(1, config=config, time_scale=0.001) as fleet:
        base = fleet.endpoints[0].openai_base_url
        async with openai.AsyncOpenAI(api_key="sk-test", base_url=base, max_retries=0) as client:
            first = await client.responses.create(model=MODEL, input="hi", max_output_tokens=4)
            with pytest.raises(openai.NotFoundError, match=first.id):
                await client.responses.create(model=MODEL, input="and?", previous_response_id=first.id)


# -- stored responses: retrieve, input items, delete ------------------------------------------


async def test_a_stored_response_is_retrieved_as_its_client_received_it(oai: openai.AsyncOpenAI) -> None:
    answer = await oai.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=6)
    got = await oai.responses.retrieve(answer.id)
    assert (got.id, got.status, got.output_text) == (answer.id, answer.status, answer.output_text)
    assert got.model_dump() == answer.model_dump()  # the very object, usage and echoes included
    stream = await oai.responses.create(model=MODEL, input="Stream one.", max_output_tokens=8, stream=True)
    final = [event async for event in stream][-1]
    assert final.type == "response.incomplete"
    got = await oai.responses.retrieve(final.response.id)
    assert (got.id, got.status, got.output_text) == (final.response.id, "incomplete", final.response.output_text)
    assert got.model_dump() == final.response.model_dump()


async def test_input_items_list_the_conversation_before_the_answer(oai: openai.AsyncOpenAI) -> None:
    first = await oai.responses.create(
        model=MODEL, instructions="Be brief.", input="Name a colour.", max_output_tokens=6
    )
    second = await oai.responses.create(
        model=MODEL, input="Another one?", max_output_tokens=6, previous_response_id=first.id
    )
    page = await oai.responses.input_items.list(second.id)
    expected = [
        ("system", "input_text", "Be brief."),
        ("user", "input_text", "Name a colour."),
        ("assistant", "output_text", first.output_text),  # the answer in between
        ("user", "input_text", "Another one?"),
    ]
    seen = [(item.role, item.content[0].type, item.content[0].text) for item in page.data]  # type: ignore[union-attr]
    assert seen == expected and second.output_text not in [text for *_, text in seen]
    ids = [item.id for item in page.data]
    assert len(set(ids)) == len(ids) and all(i.startswith("msg_") for i in ids)
    assert (page.first_id, page.last_id, page.has_more) == (ids[0], ids[-1], False)
    assert [item.id for item in (await oai.responses.input_items.list(second.id)).data] == ids  # stable
    first_items = await oai.responses.input_items.list(first.id)
    assert [item.role for item in first_items.data] == ["system", "user"]  # type: ignore[union-attr]


async def test_a_deleted_response_is_gone(oai: openai.AsyncOpenAI) -> None:
    answer = await oai.responses.create(model=MODEL, input="Forget me.", max_output_tokens=4)
    # The SDK's delete returns None, so the body is read off the raw answer.
    raw = await oai.responses.with_raw_response.delete(answer.id)
    assert raw.status_code == 200
    assert raw.http_response.json() == {"id": answer.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError) as raised:
        await oai.responses.retrieve(answer.id)
    assert answer.id in str(raised.value) and raised.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError, match=answer.id):
        await oai.responses.create(model=MODEL, input="And?", previous_response_id=answer.id)
    with pytest.raises(openai.NotFoundError, match=answer.id):
        await oai.responses.input_items.list(answer.id)
    with pytest.raises(openai.NotFoundError, match=answer.id):
        await oai.responses.delete(answer.id)


@pytest.mark.parametrize(
    ("method", "suffix"), [("GET", ""), ("DELETE", ""), ("GET", "/input_items")], ids=["get", "delete", "items"]
)
async def test_an_unknown_id_in_the_path_is_not_found(http: httpx.AsyncClient, method: str, suffix: str) -> None:
    reply = await http.request(method, f"/v1/responses/resp_never_stored{suffix}")
    assert reply.status_code == 404
    assert reply.json() == {
        "error": {
            "message": "Response with id 'resp_never_stored' not found.",
            "type": "invalid_request_error",
            "param": None,
            "code": "response_not_found",
        }
    }


async def test_each_stored_response_route_is_not_found_through_the_sdk(oai: openai.AsyncOpenAI) -> None:
    for call in (oai.responses.retrieve, oai.responses.delete, oai.responses.input_items.list):
        with pytest.raises(openai.NotFoundError, match="resp_unknown_here"):
            await call("resp_unknown_here")
