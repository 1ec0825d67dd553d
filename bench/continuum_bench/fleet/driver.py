"""The load driver: open-loop sessions over HTTP, streaming, with per-request timing.

Every request is sent with `stream: true` and `stream_options.include_usage`, so time to first
token is measured at the first content chunk and the usage chunk gives prompt, cached and
completion tokens. Modes: `direct` is the built-in round-robin baseline (request i goes to engine
i mod N); `prefix-hash` sends each request to engine `prefix_key mod N` (the shared prefix key of
`continuum_common.hashing`, no load bounds: a sanity baseline for what sticky routing can gain);
`url` sends everything to a router under test: one OpenAI-compatible base URL, or several (the
replicas of one router), taken in turn per request as a round-robin load balancer would. With
`api_form="responses"` chat requests go to `/v1/responses` instead, and with
`api_form="responses-stored"` a conversation's later turns continue the previous response by its
id (fleet/responses_form.py).

An interruption (`interrupt_at`, `on_interrupt`) stops the run for a moment at a given time, as a
rolling restart of the router does: new requests wait, the requests in flight finish, then
`on_interrupt` gets the targets and returns the ones to use from then on (a restarted router
may listen elsewhere), and the waiting requests go out. Their time to first token counts from
when they are sent, so the pause itself is not in it; `interruption` records when it began and
how long it lasted.

The client's own CPU work stays off its event loop, so it does not delay the requests in flight
(their writes, and the reading of their first chunks, would otherwise wait for it and count as
the router's time): a session's next request (rendering its prompt and tokenizing it, about
50 ms for a 12k-token prompt with a Hugging Face tokenizer) is prepared on one worker thread
before it is due, a trace request `PREPARE_AHEAD` seconds before its time, a later turn during
the think time before it; and the ideal cache (fleet/ideal.py) takes each send and each answer
on the same thread, in the order they happened, its hits filled in once the run is over. The
single worker keeps the workload's and the ideal cache's state in one thread and their calls in
order; the tokenizer releases the interpreter lock while it encodes. A request whose
preparation ran past its time goes out at once and is counted in `late_sends`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import orjson

from continuum_bench.fleet.ideal import IdealCache
from continuum_bench.fleet.legs import Legs
from continuum_bench.fleet.responses_form import (
    StoredTurn,
    event_response_id,
    event_text,
    event_usage,
    responses_body,
)
from continuum_bench.fleet.tokens import TokenCodec
from continuum_bench.fleet.workloads import BenchRequest, Session, Workload
from continuum_common.hashing import request_prefix_key

# Continuum's ingress names the backend it forwarded to in this answer header.
BACKEND_HEADER = "x-continuum-backend"
# Real seconds before its time a session's first request is prepared.
PREPARE_AHEAD = 1.0
# A request sent later than this after its time counts as a late send.
LATE_AFTER = 0.05

T = TypeVar("T")


def _nothing() -> None:
    return None


class InterruptFailed(RuntimeError):
    """The interruption's action failed (a restarted router did not come back): the run stops."""


@dataclass
class RequestResult:
    ok: bool
    error: str | None
    engine: int | None
    sent_at: float  # real seconds since the run started
    ttft: float | None  # real seconds
    e2e: float | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ideal_hit_tokens: int
    replica: int | None = None  # which router replica (url mode) took the request
    # The backend the router says it chose (Continuum's `x-continuum-backend` answer header);
    # None from routers that do not say.
    backend: str | None = None
    # The `x-request-id` it was sent with, and when (time.monotonic(), the clock the simulated
    # engines stamp requests with: legs.py joins the two)
    request_id: str | None = None
    sent_clock: float | None = None
    legs: Legs | None = None  # its TTFT split with the engine's stamps, after the run


class Progress:
    """A one-line progress bar on stderr, redrawn at most 5 times a second."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = total
        self.done = 0
        self.errors = 0
        self.in_flight = 0
        self.enabled = enabled
        self._last = 0.0
        self._start = time.monotonic()

    def update(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < 0.2):
            return
        self._last = now
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        bar = "#" * filled + "." * (width - filled)
        sys.stderr.write(
            f"\r[{bar}] {self.done}/{self.total} done  {self.errors} errors  {self.in_flight} in flight  {now - self._start:6.1f}s "
        )
        sys.stderr.flush()

    def finish(self) -> None:
        self.update(force=True)
        if self.enabled:
            sys.stderr.write("\n")


class Driver:
    def __init__(
        self,
        targets: list[str],
        *,
        mode: str,
        model: str,
        time_scale: float,
        ideals: list[IdealCache],
        codec: TokenCodec,
        request_timeout: float = 600.0,
        progress: Progress | None = None,
        api_form: str = "native",
        interrupt_at: float | None = None,
        on_interrupt: Callable[[list[str]], Awaitable[list[str]]] | None = None,
        prepare_ahead: float = PREPARE_AHEAD,
    ) -> None:
        self.targets = targets
        self.mode = mode
        self.model = model
        self.time_scale = time_scale
        self.ideals = ideals  # the first one's hit is recorded per request
        self.codec = codec
        self.request_timeout = request_timeout
        self.api_form = api_form
        self.progress = progress or Progress(0, enabled=False)
        self.results: list[RequestResult] = []
        self.interrupt_at = interrupt_at
        self.on_interrupt = on_interrupt
        # (began, seconds, drained): since the run's start; `drained` is the part spent waiting for
        # the requests in flight to finish, before the action (the router's restart) began
        self.interruption: tuple[float, float, float] | None = None
        self._open = asyncio.Event()  # clear while an interruption holds new requests back
        self._open.set()
        self._active = 0  # requests sent and not finished
        self._drained = asyncio.Event()
        self._counter = 0
        self._t0 = 0.0
        self._ids = f"bench-{os.getpid():x}-{time.monotonic_ns():x}"  # unique per run, never reused
        self._sent = 0
        self.prepare_ahead = prepare_ahead
        self.late_sends = 0  # requests sent more than LATE_AFTER after their time
        self._worker: ThreadPoolExecutor | None = None
        # (result, its ideal hit being computed on the worker), filled in after the run
        self._ideal_hits: list[tuple[RequestResult, asyncio.Future[int]]] = []

    async def run(self, workload: Workload) -> list[RequestResult]:
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=1024)
        timeout = httpx.Timeout(self.request_timeout, connect=10.0)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-client")
        try:
            async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
                self._t0 = time.monotonic()
                await self._launch(client, workload)
            for result, hit in self._ideal_hits:
                result.ideal_hit_tokens = await hit
            await self._off_loop(_nothing)  # every answer is in the ideal cache too
        finally:
            # Idle after the barrier above; after an error its current call ends on its own.
            self._worker.shutdown(wait=False, cancel_futures=True)
            self._worker = None
        self.progress.finish()
        return self.results

    async def _launch(self, client: httpx.AsyncClient, workload: Workload) -> None:
        """Start each session `prepare_ahead` seconds before its first request is due."""
        try:
            async with asyncio.TaskGroup() as group:
                if self.interrupt_at is not None and self.on_interrupt is not None:
                    group.create_task(self._interrupt(self.interrupt_at, self.on_interrupt))
                for session in workload.sessions():
                    due = self._t0 + session.start * self.time_scale
                    delay = due - self.prepare_ahead - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    group.create_task(self._run_session(client, session, due))
        except* InterruptFailed as failed:
            error = failed.exceptions[0]
            raise error from error.__cause__

    def _submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`fn(*args)` on the client's worker thread, after the work submitted before it."""
        assert self._worker is not None
        return asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._submit(fn, *args)

    async def _interrupt(self, at: float, action: Callable[[list[str]], Awaitable[list[str]]]) -> None:
        await asyncio.sleep(max(0.0, self._t0 + at - time.monotonic()))
        began = time.monotonic()
        self._open.clear()
        self._drained.clear()
        if self._active:
            await self._drained.wait()
        drained = time.monotonic() - began
        try:
            self.targets = await action(list(self.targets))
        except Exception as exc:
            raise InterruptFailed(f"the interruption at {at:g} s failed: {exc}") from exc
        finally:
            self.interruption = (began - self._t0, time.monotonic() - began, drained)
            self._open.set()

    async def _run_session(self, client: httpx.AsyncClient, session: Session, due: float) -> None:
        """Each request is prepared off the loop, then sent at its time (`due`: the session's
        start, then the end of each think time)."""
        previous: str | None = None
        stored = StoredTurn() if self.api_form == "responses-stored" else None
        while (request := await self._off_loop(session.next_request, previous)) is not None:
            late = time.monotonic() - due
            if late < 0:
                await asyncio.sleep(-late)
            elif late > LATE_AFTER:
                self.late_sends += 1
            result, text = await self._send(client, request, stored)
            previous = text if result.ok else None
            due = time.monotonic() + max(0.0, session.think_time()) * self.time_scale

    def _target(self, request: BenchRequest) -> tuple[str, int | None, int | None]:
        """(base URL, engine index when the benchmark picks it, router replica index)."""
        index = self._counter
        self._counter += 1
        if self.mode == "direct":
            engine = index % len(self.targets)
            return self.targets[engine], engine, None
        if self.mode == "prefix-hash":
            key = request_prefix_key({"model": self.model, **request.body}, enabled=True) or b"\0"
            engine = int.from_bytes(key[:8], "big") % len(self.targets)
            return self.targets[engine], engine, None
        replica = index % len(self.targets)
        return self.targets[replica], None, replica

    def _ideal_send(self, prompt_ids: list[int]) -> int:
        hits = [cache.on_send(prompt_ids) for cache in self.ideals]
        return hits[0]

    def _ideal_complete(self, prompt_ids: list[int], text: str) -> None:
        output_ids = self.codec.encode(text)
        for cache in self.ideals:
            cache.on_complete(prompt_ids, output_ids)

    async def _send(
        self, client: httpx.AsyncClient, request: BenchRequest, stored: StoredTurn | None = None
    ) -> tuple[RequestResult, str]:
        if not self._open.is_set():
            await self._open.wait()
        self._active += 1  # no await between the gate and here: an interruption sees it
        try:
            return await self._send_now(client, request, stored)
        finally:
            self._active -= 1
            if not self._active:
                self._drained.set()

    async def _send_now(
        self, client: httpx.AsyncClient, request: BenchRequest, stored: StoredTurn | None
    ) -> tuple[RequestResult, str]:
        base, engine, replica = self._target(request)
        form: str = request.api
        if self.api_form != "native" and request.api == "chat":
            path, form = "/responses", "responses"
            inner = responses_body(request.body) if stored is None else stored.body(request.body)
            body = {"model": self.model, **inner, "stream": True}
        else:
            path = "/chat/completions" if request.api == "chat" else "/completions"
            body = {"model": self.model, **request.body, "stream": True, "stream_options": {"include_usage": True}}
        # Submitted now, so the ideal cache sees the sends and answers in the order they happened.
        ideal_hit = self._submit(self._ideal_send, request.prompt_ids)
        self._sent += 1
        request_id = f"{self._ids}-{self._sent}"
        sent = time.monotonic()
        self.progress.in_flight += 1
        self.progress.update()
        text, error, ttft, response_id = "", None, None, None
        usage: dict[str, Any] = {}
        routed: list[str] = []  # the chosen backend, when the router names it
        try:
            async with asyncio.timeout(self.request_timeout):
                text, ttft, usage, response_id = await self._stream(
                    client, base + path, body, form, sent, routed, request_id
                )
        except (httpx.HTTPError, TimeoutError, ValueError, KeyError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        end = time.monotonic()
        self.progress.in_flight -= 1
        ok = error is None
        if stored is not None and request.api == "chat":
            stored.answered(request.body, response_id if ok else None, text)
        if ok:
            self._submit(self._ideal_complete, request.prompt_ids, text)
        details = usage.get("prompt_tokens_details") or {}
        result = RequestResult(
            ok=ok,
            error=error,
            engine=engine,
            sent_at=sent - self._t0,
            ttft=ttft,
            e2e=(end - sent) if ok else None,
            prompt_tokens=int(usage.get("prompt_tokens", len(request.prompt_ids))),
            cached_tokens=int(details.get("cached_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            ideal_hit_tokens=0,  # filled in after the run
            replica=replica,
            backend=routed[0] if routed else None,
            request_id=request_id,
            sent_clock=sent,
        )
        self._ideal_hits.append((result, ideal_hit))
        self.results.append(result)
        self.progress.done += 1
        self.progress.errors += 0 if ok else 1
        self.progress.update()
        return result, text

    async def _stream(
        self,
        client: httpx.AsyncClient,
        url: str,
        body: dict[str, Any],
        api: str,
        sent: float,
        routed: list[str],
        request_id: str,
    ) -> tuple[str, float | None, dict[str, Any], str | None]:
        parts: list[str] = []
        ttft: float | None = None
        usage: dict[str, Any] = {}
        response_id: str | None = None
        async with client.stream("POST", url, json=body, headers={"x-request-id": request_id}) as resp:
            if backend := resp.headers.get(BACKEND_HEADER):
                routed.append(backend)
            if resp.status_code != 200:
                detail = (await resp.aread())[:200].decode(errors="replace")
                raise ValueError(f"HTTP {resp.status_code}: {detail}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = orjson.loads(data)
                if "error" in chunk:
                    raise ValueError(f"stream error: {str(chunk['error'])[:200]}")
                if api == "responses":
                    response_id = response_id or event_response_id(chunk)
                    pieces = [event_text(chunk)]
                    usage = event_usage(chunk) or usage
                else:
                    usage = chunk.get("usage") or usage
                    pieces = [
                        choice["delta"].get("content") if api == "chat" else choice.get("text")
                        for choice in chunk.get("choices") or ()
                    ]
                for piece in pieces:
                    if piece:
                        if ttft is None:
                            ttft = time.monotonic() - sent
                        parts.append(piece)
        if ttft is None:
            raise ValueError("the stream carried no content")
        return "".join(parts), ttft, usage, response_id
