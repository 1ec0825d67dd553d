"""A small OpenAI- and Anthropic-compatible upstream for tests and benchmarks.

It speaks the wire formats of reference/provider-apis.md (chat completions with `data: [DONE]`
streams, completions, embeddings incl. base64, responses, Anthropic messages with `event:` lines),
records every request it receives, and can be told to misbehave: answer 5xx, stall, hang until
the client goes away, or break a stream off after N chunks. Raw ASGI, served by uvicorn on a
free loopback port.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import struct
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from continuum_ingress.asgi import Message, Receive, Scope, Send
from continuum_ingress.server import RunningServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class StreamBreak(Exception):
    """Raised inside the app to drop the connection mid-stream (uvicorn closes the socket)."""


@dataclass
class StubUpstream:
    name: str
    requests: list[Received] = field(default_factory=list)
    fail_next: int = 0  # answer the next N requests with `fail_status`
    fail_status: int = 500
    delay: float = 0.0  # seconds before answering (the client may give up meanwhile)
    hang: bool = False  # never answer; wait for the client to disconnect
    hold: asyncio.Event | None = None  # answer only once this is set
    chunk_delay: float = 0.0
    break_stream_after: int | None = None
    stall_after: int | None = None  # pause `stall_s` seconds after sending this many stream events
    stall_s: float = 0.0
    end_delay: float = 0.0  # seconds between a stream's last event and the end of its body
    health_status: int = 200
    # `POST /tokenize` answers `{"tokens": tokenize(body)}` after `tokenize_delay` seconds; 404 when None
    tokenize: Callable[[dict[str, Any]], list[int]] | None = None
    tokenize_delay: float = 0.0
    cancelled: int = 0  # requests whose client disconnected before the answer was finished
    active: int = 0
    peak_active: int = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if scope["method"] == "GET":
            if path == "/health":
                await _json(send, self.health_status, {"status": "ok" if self.health_status == 200 else "down"})
            else:
                await _json(send, 404, {"error": {"message": "not found", "type": "invalid_request_error"}})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        body = orjson.loads(raw) if raw else {}
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.requests.append(Received(path, headers, body))
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)
        try:
            await self._answer(path, body, receive, send)
        finally:
            self.active -= 1

    async def _answer(self, path: str, body: dict[str, Any], receive: Receive, send: Send) -> None:
        if (self.hang or self.delay) and await _client_left(receive, None if self.hang else self.delay):
            self.cancelled += 1
            return
        if self.hold is not None and not self.hold.is_set() and await _client_left(receive, None, self.hold):
            self.cancelled += 1
            return
        if path == "/tokenize" and self.tokenize is not None:
            if self.tokenize_delay and await _client_left(receive, self.tokenize_delay):
                self.cancelled += 1
                return
            tokens = self.tokenize(body)
            await _json(send, 200, {"count": len(tokens), "tokens": tokens})
            return
        if self.fail_next > 0:
            self.fail_next -= 1
            await _json(send, self.fail_status, {"error": {"message": f"{self.name} failed", "type": "server_error"}})
            return
        handler = {
            "/v1/chat/completions": self._chat,
            "/v1/completions": self._completions,
            "/v1/embeddings": self._embeddings,
            "/v1/responses": self._responses,
            "/v1/messages": self._messages,
            "/v1beta/openai/chat/completions": self._chat,
        }.get(path)
        if handler is None:
            await _json(send, 404, {"error": {"message": f"no route {path}", "type": "invalid_request_error"}})
            return
        await handler(body, receive, send)

    # -- OpenAI ----------------------------------------------------------------------------
    def _text(self) -> str:
        return f"hello from {self.name}"

    async def _chat(self, body: dict[str, Any], receive: Receive, send: Send) -> None:
        model = body.get("model", "")
        if not body.get("stream"):
            await _json(
                send,
                200,
                {
                    "id": f"chatcmpl-{len(self.requests)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": self._text(), "refusal": None},
                            "logprobs": None,
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
                },
                self.name,
            )
            return
        base = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        frames = [
            {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        ]
        frames += [
            {**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            for piece in ("hello ", "from ", self.name)
        ]
        frames.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        events = [b"data: " + orjson.dumps(f) + b"\n\n" for f in frames] + [b"data: [DONE]\n\n"]
        await self._sse(events, receive, send)

    async def _completions(self, body: dict[str, Any], receive: Receive, send: Send) -> None:
        base = {"id": "cmpl-1", "object": "text_completion", "created": int(time.time()), "model": body.get("model")}
        if not body.get("stream"):
            choice = {"index": 0, "text": self._text(), "finish_reason": "stop", "logprobs": None}
            usage = {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
            await _json(send, 200, {**base, "choices": [choice], "usage": usage}, self.name)
            return
        pieces = ("hello ", "from ", self.name)
        events = [
            b"data: "
            + orjson.dumps({**base, "choices": [{"index": 0, "text": p, "finish_reason": None, "logprobs": None}]})
            + b"\n\n"
            for p in pieces
        ] + [b"data: [DONE]\n\n"]
        await self._sse(events, receive, send)

    async def _embeddings(self, body: dict[str, Any], receive: Receive, send: Send) -> None:
        inputs = body.get("input")
        count = len(inputs) if isinstance(inputs, list) and inputs and not isinstance(inputs[0], int) else 1
        vector = [0.25, -0.5, 1.0]
        value: Any = vector
        if body.get("encoding_format") == "base64":
            value = base64.b64encode(struct.pack("<3f", *vector)).decode()
        data = [{"object": "embedding", "index": i, "embedding": value} for i in range(count)]
        usage = {"prompt_tokens": 2, "total_tokens": 2}
        await _json(send, 200, {"object": "list", "data": data, "model": body.get("model"), "usage": usage}, self.name)

    async def _responses(self, body: dict[str, Any], receive: Receive, send: Send) -> None:
        payload = {
            "id": "resp_1",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model"),
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": self._text(), "annotations": []}],
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": 5,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 3,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 8,
            },
        }
        await _json(send, 200, payload, self.name)

    # -- Anthropic -------------------------------------------------------------------------
    async def _messages(self, body: dict[str, Any], receive: Receive, send: Send) -> None:
        model = body.get("model")
        usage = {"input_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 3}
        if not body.get("stream"):
            payload = {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": self._text()}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": usage,
            }
            await _json(send, 200, payload, self.name)
            return
        start = {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": model,
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {**usage, "output_tokens": 1},
            },
        }
        frames: list[tuple[str, dict[str, Any]]] = [
            ("message_start", start),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            ("ping", {"type": "ping"}),
        ]
        frames += [
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}},
            )
            for p in ("hello ", "from ", self.name)
        ]
        frames += [
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": usage},
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        events = [f"event: {name}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n" for name, data in frames]
        await self._sse(events, receive, send)

    async def _sse(self, events: Sequence[bytes], receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream"), (b"x-upstream", self.name.encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i, event in enumerate(events):
            if self.break_stream_after is not None and i >= self.break_stream_after:
                raise StreamBreak(self.name)
            if self.chunk_delay and await _client_left(receive, self.chunk_delay):
                self.cancelled += 1
                return
            if i == self.stall_after and await _client_left(receive, self.stall_s):
                self.cancelled += 1
                return
            await send({"type": "http.response.body", "body": event, "more_body": True})
        if self.end_delay and await _client_left(receive, self.end_delay):
            self.cancelled += 1  # e.g. a client that closed the connection on `[DONE]`
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _client_left(receive: Receive, wait_s: float | None, until: asyncio.Event | None = None) -> bool:
    """Wait up to `wait_s` seconds (forever when None), or until `until` is set; True when the
    client disconnected first."""

    async def disconnect() -> Message:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return message

    watch = asyncio.ensure_future(disconnect())
    waits: set[asyncio.Future[Any]] = {watch}
    if until is not None:
        waits.add(asyncio.ensure_future(until.wait()))
    try:
        done, _ = await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for fut in waits:
            fut.cancel()
    return watch in done


async def _json(send: Send, status: int, payload: object, name: str | None = None) -> None:
    data = orjson.dumps(payload)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if name:
        headers.append((b"x-upstream", name.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})


@dataclass
class RunningStub:
    stub: StubUpstream
    server: RunningServer

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def name(self) -> str:
        return self.stub.name


@contextlib.asynccontextmanager
async def running_stubs(*names: str) -> AsyncIterator[list[RunningStub]]:
    """Start one StubUpstream per name on free loopback ports; stop them all on exit (together:
    uvicorn notices a stop request on its 0.1 s tick)."""
    out: list[RunningStub] = []
    try:
        for name in names:
            stub = StubUpstream(name)
            server = RunningServer(stub)
            await server.__aenter__()
            out.append(RunningStub(stub, server))
        yield out
    finally:
        for running in out:
            running.server.server.should_exit = True
        await asyncio.gather(*(running.server.stop() for running in out))
