"""Real-socket stand-ins for engines, used by the listener's tests and benchmarks.

* `EnginePublisher`: a ZMQ PUB socket that frames batches exactly like vLLM's
  `ZmqEventPublisher` ([topic, u64be seq, payload]) plus a ROUTER replay socket answering DEALER
  requests in either reply shape of kv-events-spec §1.2 (`old`: [seq, payload], `new`: [topic,
  seq, payload]) with the all-ff end marker. It can skip seqs (a forced gap) and restart.
* `DetokenizeServer`: `POST /detokenize` over loopback HTTP, decoding with a given vocabulary.
* `TrtllmServer`: trtllm-serve's `POST /kv_cache_events` drain over loopback HTTP, serving the
  bodies queued by the test (raw bytes, so malformed ones too).
* `chatml_tokens`: a tiny tokenizer for the sim engine's ChatML template.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import msgpack
import orjson
import zmq
import zmq.asyncio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from continuum_common.asgi_server import EmbeddedServer
from continuum_listener.protocol.frames import END_SEQ

ReplayShape = Literal["old", "new"]


class EnginePublisher:
    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "kv-events",
        bind: bool = True,
        shape: ReplayShape = "new",
        buffer_steps: int = 10_000,
        sndhwm: int = 1_000_000,
    ) -> None:
        self.topic = topic.encode()
        self.shape = shape
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        # XPUB: wire-identical to PUB for the subscriber, and it tells us when a SUB has
        # subscribed, so tests never lose their first batch to the "slow joiner" race.
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, sndhwm)
        if bind:
            self.pub.bind(endpoint)
        else:
            self.pub.connect(endpoint)
        self.router: zmq.asyncio.Socket | None = None
        self.replay_requests: list[int] = []
        self._task: asyncio.Task[None] | None = None
        if replay_endpoint is not None:
            self.router = ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.setsockopt(zmq.SNDHWM, 0)  # a replay is never cut short by the stand-in
            try:
                self.router.bind(replay_endpoint)
            except zmq.ZMQError:  # leave nothing bound: the caller may try again
                self.router.close(linger=0)
                self.pub.close(linger=0)
                raise
            self._task = asyncio.create_task(self._serve_replay())

    async def wait_subscribed(self) -> None:
        """Wait (at most 10 s) until a subscriber's subscription has reached this socket."""
        async with asyncio.timeout(10.0):
            while (await self.pub.recv())[:1] != b"\x01":
                pass

    async def send(self, payload: bytes, *, frames: list[bytes] | None = None) -> int:
        """Publish one batch with the next seq (or raw `frames` as given); returns the seq."""
        if frames is not None:
            await self.pub.send_multipart(frames)
            return -1
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def skip(self, payload: bytes) -> int:
        """Buffer a batch for replay without publishing it live (what a HWM drop looks like)."""
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        return seq

    def restart(self) -> None:
        """What an engine restart looks like on the wire: seq from 0, empty replay buffer."""
        self.seq = 0
        self.buffer.clear()

    async def _serve_replay(self) -> None:
        assert self.router is not None
        while True:
            frames = await self.router.recv_multipart()
            if len(frames) != 3:
                continue
            identity, _, start_frame = frames
            start = int.from_bytes(start_frame, "big")
            self.replay_requests.append(start)
            for seq, payload in list(self.buffer):
                if seq >= start:
                    await self.router.send_multipart([identity, b"", *self._reply(seq.to_bytes(8, "big"), payload)])
            await self.router.send_multipart([identity, b"", *self._reply(END_SEQ, b"", end=True)])

    def _reply(self, seq: bytes, payload: bytes, *, end: bool = False) -> list[bytes]:
        if self.shape == "old":
            return [seq, payload]
        return [b"" if end else self.topic, seq, payload]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.router is not None:
            self.router.close(linger=0)
        self.pub.close(linger=0)


def batch(events: list[Any], *, ts: float = 1767225600.125, rank: int | None = 0) -> bytes:
    """A vLLM KVEventBatch payload; `events` are already tagged arrays or maps."""
    payload: bytes = msgpack.packb([ts, events, rank] if rank is not None else [ts, events], use_bin_type=True)
    return payload


def stored(
    hashes: list[int],
    parent: int | None,
    tokens: list[int],
    block_size: int,
    *,
    medium: str | None = "GPU",
    salt: str | None = None,
    lora_name: str | None = None,
) -> dict[str, Any]:
    """A map-encoded (vLLM ≥ 2026-06) BlockStored event."""
    extra: list[Any] | None = None
    if salt is not None:
        extra = [[salt]] + [None] * (len(hashes) - 1)
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": lora_name,
        "extra_keys": extra,
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def removed(hashes: list[int], medium: str = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium, "group_idx": 0}


# -- ChatML (the sim engine's template) -------------------------------------------------------------

IM_START, IM_END = 1, 2
_CHATML_SPECIAL = {IM_START: "<|im_start|>", IM_END: "<|im_end|>"}
_BYTE_BASE = 256  # token id = 256 + byte value, so any UTF-8 text round-trips


def chatml_tokens(messages: list[dict[str, str]], *, generation_prompt: bool = True) -> list[int]:
    """Token ids of the ChatML rendering; special tokens 1 and 2, every other byte 256 + b."""
    out: list[int] = []
    for message in messages:
        out.append(IM_START)
        out.extend(_BYTE_BASE + b for b in f"{message['role']}\n{message['content']}".encode())
        out.append(IM_END)
        out.append(_BYTE_BASE + ord("\n"))
    if generation_prompt:
        out.append(IM_START)
        out.extend(_BYTE_BASE + b for b in b"assistant\n")
    return out


def chatml_decode(tokens: list[int]) -> str:
    """Decode like a byte-level tokenizer: bytes of a cut character become U+FFFD."""
    parts: list[str] = []
    pending = bytearray()
    for token in tokens:
        special = _CHATML_SPECIAL.get(token)
        if special is None and token >= _BYTE_BASE:
            pending.append(token - _BYTE_BASE)
            continue
        parts.append(pending.decode("utf-8", "replace"))
        pending.clear()
        parts.append(special if special is not None else f"<unk{token}>")
    parts.append(pending.decode("utf-8", "replace"))
    return "".join(parts)


# -- HTTP stand-ins -------------------------------------------------------------------------------


class _Http:
    def __init__(self, app: Starlette, listen: str = "127.0.0.1:0") -> None:
        host, _, port = listen.rpartition(":")
        self.server = EmbeddedServer(app, host, int(port))

    @property
    def url(self) -> str:
        return self.server.url

    async def __aenter__(self) -> _Http:
        await self.server.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.server.stop()


class DetokenizeServer(_Http):
    def __init__(self, decode: Callable[[list[int]], str] = chatml_decode, *, delay: float = 0.0) -> None:
        self.calls = 0
        self.status = 200
        self.delay = delay

        async def detokenize(request: Request) -> Response:
            self.calls += 1
            if self.delay:
                await asyncio.sleep(self.delay)
            body = orjson.loads(await request.body())
            if self.status != 200:
                return JSONResponse({"error": {"message": "test failure", "code": self.status}}, self.status)
            return JSONResponse({"prompt": decode(body["tokens"])})

        super().__init__(Starlette(routes=[Route("/detokenize", detokenize, methods=["POST"])]))


class TrtllmServer(_Http):
    """Serves queued bodies, then `[]` after `idle_wait` seconds (the real server waits 2 s)."""

    def __init__(self, *, idle_wait: float = 0.05, listen: str = "127.0.0.1:0") -> None:
        self.bodies: asyncio.Queue[tuple[int, bytes, dict[str, str]]] = asyncio.Queue()
        self.polls = 0
        self.idle_wait = idle_wait

        async def drain(_request: Request) -> Response:
            self.polls += 1
            try:
                status, body, headers = await asyncio.wait_for(self.bodies.get(), self.idle_wait)
            except TimeoutError:
                return Response(b"[]", media_type="application/json")
            return Response(body, status, headers=headers, media_type="application/json")

        super().__init__(Starlette(routes=[Route("/kv_cache_events", drain, methods=["POST"])]), listen)

    def push(
        self, events: list[dict[str, Any]] | bytes, *, status: int = 200, headers: dict[str, str] | None = None
    ) -> None:
        body = events if isinstance(events, bytes) else orjson.dumps(events)
        self.bodies.put_nowait((status, body, headers or {}))


@contextlib.asynccontextmanager
async def serving(server: _Http) -> AsyncIterator[str]:
    async with server:
        yield server.url
