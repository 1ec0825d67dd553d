"""The engine's HTTP API (FastAPI): vLLM's OpenAI-compatible routes plus Anthropic `/v1/messages`.

Routes: POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/messages, /tokenize,
/detokenize, /reset_prefix_cache, /sim/reset (the simulator's own: as a fresh engine); GET /v1/models,
/health, /version, /metrics, /sim/request-times (the simulator's own: per-request stamps for
benchmarks), /v1/responses/{id}, /v1/responses/{id}/input_items; DELETE /v1/responses/{id}.
Bad input gets vLLM's error object (`{"error": {message, type, param, code}}`) or, on
/v1/messages, Anthropic's; the engine keeps serving. A client that disconnects mid-request
aborts it, which frees its KV blocks. /v1/responses keeps finished responses in a bounded
per-engine store (`EngineConfig.responses_store`) for later requests' `previous_response_id`
and for the /v1/responses/{id} routes, which retrieve, list and delete them (404
`response_not_found` for an id this engine does not hold).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response, StreamingResponse

from continuum_sim.adapters.prompt_tokens import PromptTokens
from continuum_sim.engine import RequestHandle, SimEngine
from continuum_sim.errors import (
    Conflict,
    EngineBusy,
    InvalidRequest,
    RequestError,
    ResponseNotFound,
    UnsupportedMediaType,
)
from continuum_sim.policy.request import RequestStatus
from continuum_sim.protocol import embeddings as emb
from continuum_sim.protocol import responses as r
from continuum_sim.protocol import responses_api as ra
from continuum_sim.protocol.requests import (
    GenerateParams,
    anthropic_messages,
    chat_messages,
    completion_prompt,
    detokenize_tokens,
    embedding_request,
    generate_params,
    resolve_model,
    tokenize_request,
)
from continuum_sim.protocol.response_store import ResponseStore
from continuum_sim.request_times import RequestTimes, TimeLog

log = logging.getLogger(__name__)
Handler = Callable[[Request], Awaitable[Response]]
SIM_VERSION = "0.1.0-continuum-sim"


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


async def read_json(request: Request) -> dict[str, Any]:
    if "application/json" not in request.headers.get("content-type", ""):
        raise UnsupportedMediaType("Unsupported Media Type: Only 'application/json' is allowed")
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object")
    return body


def _guard(handler: Handler, *, anthropic: bool = False) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except RequestError as exc:
            body = r.anthropic_error(exc) if anthropic else r.openai_error(exc)
            return json_response(body, exc.status)

    return wrapped


class EngineApi:
    def __init__(
        self, engine: SimEngine, served_models: list[str], responses_store: ResponseStore, prompts: PromptTokens
    ) -> None:
        self.engine = engine
        self.codec = engine.codec
        self.prompts = prompts  # prompt text -> ids, off the loop with a Hugging Face tokenizer
        self.served = served_models
        self.responses_store = responses_store
        self.created = r.now()
        self.times = TimeLog()  # per-request stamps for benchmarks (GET /sim/request-times)

    # -- helpers ------------------------------------------------------------------------

    def _submit(
        self, ids: list[int], params: GenerateParams, arrived: float, times: RequestTimes | None = None
    ) -> RequestHandle:
        handle = self.engine.submit(ids, max_tokens=params.max_tokens, cache_salt=params.cache_salt, seed=params.seed)
        self._front(arrived)
        if times is not None:
            times.submitted = time.monotonic()
        return handle

    def _timed(self, request: Request) -> RequestTimes | None:
        """Start the request's stamps when it carries an `x-request-id` (its handler began now)."""
        return self.times.start(request.headers.get("x-request-id"), time.monotonic())

    @staticmethod
    def _arrived(times: RequestTimes | None) -> float:
        """The body in hand, as vLLM stamps a request's arrival (perf_counter, for the metrics)."""
        if times is not None:
            times.arrived = time.monotonic()
        return time.perf_counter()

    def _front(self, arrived: float) -> None:
        """Record the time before the engine's clock started (`arrived`: perf_counter())."""
        self.engine.metrics.front.observe(time.perf_counter() - arrived)

    async def _finish(self, handle: RequestHandle) -> list[int]:
        try:
            tokens = await handle.wait()
        except asyncio.CancelledError:
            self.engine.abort(handle)
            raise
        if not tokens and handle.request.status == RequestStatus.ABORTED:
            raise EngineBusy("The engine's waiting queue is full; retry later.")
        return tokens

    def _usage(self, handle: RequestHandle) -> dict[str, Any]:
        return r.usage(handle.prompt_tokens, len(handle.output_token_ids), handle.cached_tokens)

    def _stream(
        self,
        chunks: AsyncIterator[bytes],
        handle: RequestHandle,
        arrived: float,
        times: RequestTimes | None = None,
        content_at: int = 0,
    ) -> StreamingResponse:
        """`content_at`: which chunk carries the first content (a chat stream's role chunk comes first)."""

        async def body() -> AsyncIterator[bytes]:
            sent = 0
            try:
                async for chunk in chunks:
                    if times is not None and sent <= content_at:  # stamped as handed over, before its write
                        now = time.monotonic()
                        times.first_chunk = times.first_chunk or now
                        times.first_content = now
                    yield chunk
                    sent += 1
                    if sent == 1:  # handed to the server: what a client can see next, however busy this loop is
                        self.engine.metrics.first_chunk.observe(time.perf_counter() - arrived)
            finally:
                if not handle.finished:
                    self.engine.abort(handle)

        return StreamingResponse(body(), media_type="text/event-stream", headers={"cache-control": "no-cache"})

    def _params(self, body: dict[str, Any]) -> GenerateParams:
        """An OpenAI chat or completion request's parameters; `return_token_ids` is ignored
        unless the engine answers it (config.return_token_ids)."""
        params = generate_params(body, self.served)
        if params.token_ids and not self.engine.config.return_token_ids:
            params = dataclasses.replace(params, token_ids=False)
        return params

    def _check_ids(self, ids: list[int]) -> list[int]:
        for token in ids:
            if not self.codec.is_valid_id(token):
                raise InvalidRequest(f"Token id {token} is out of vocabulary", param="prompt")
        return ids

    # -- OpenAI chat / completions ----------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        times = self._timed(request)
        body = await read_json(request)
        arrived = self._arrived(times)
        params = self._params(body)
        messages = chat_messages(body)
        text = self.codec.render_chat(
            messages,
            add_generation_prompt=body.get("add_generation_prompt", True) is not False,
            continue_final_message=body.get("continue_final_message") is True,
        )
        prompt_ids = await self.prompts.encode(text, add_special_tokens=False)
        handle = self._submit(prompt_ids, params, arrived, times)
        if params.stream:
            return self._stream(self._chat_events(handle, params, prompt_ids), handle, arrived, times, content_at=1)
        tokens = await self._finish(handle)
        rid = r.new_id("chatcmpl-")
        ids = (prompt_ids, list(tokens)) if params.token_ids else None
        text = self.codec.decode(tokens)
        return json_response(
            r.chat_completion(rid, params.model, text, handle.finish_reason, self._usage(handle), ids=ids)
        )

    async def _chat_events(
        self, handle: RequestHandle, params: GenerateParams, prompt_ids: list[int]
    ) -> AsyncIterator[bytes]:
        rid, created, inc = r.new_id("chatcmpl-"), r.now(), params.include_usage
        sent_role = False
        with_ids = params.token_ids
        async for ids in handle.chunks():
            if not sent_role:
                role = {"role": "assistant", "content": ""}
                prompt = prompt_ids if with_ids else None
                yield r.sse_data(
                    r.chat_chunk(rid, params.model, created, role, None, include_usage=inc, prompt_token_ids=prompt)
                )
                sent_role = True
            finish = handle.finish_reason if handle.finished else None
            delta = {"content": self.codec.decode(ids)}
            out = list(ids) if with_ids else None
            yield r.sse_data(r.chat_chunk(rid, params.model, created, delta, finish, include_usage=inc, token_ids=out))
        if not sent_role:
            yield r.sse_data(r.openai_error(EngineBusy("The engine's waiting queue is full; retry later.")))
            return
        if inc:
            yield r.sse_data(r.usage_chunk(rid, params.model, created, "chat.completion.chunk", self._usage(handle)))
        yield r.SSE_DONE

    async def completions(self, request: Request) -> Response:
        times = self._timed(request)
        body = await read_json(request)
        arrived = self._arrived(times)
        params = self._params(body)
        prompt = completion_prompt(body)
        if isinstance(prompt, str):
            ids = await self.prompts.encode(prompt, add_special_tokens=True)
        else:
            ids = self._check_ids(prompt)
        handle = self._submit(ids, params, arrived, times)
        if params.stream:
            return self._stream(self._completion_events(handle, params, ids), handle, arrived, times)
        tokens = await self._finish(handle)
        rid = r.new_id("cmpl-")
        both = (ids, list(tokens)) if params.token_ids else None
        text = self.codec.decode(tokens)
        return json_response(r.completion(rid, params.model, text, handle.finish_reason, self._usage(handle), ids=both))

    async def _completion_events(
        self, handle: RequestHandle, params: GenerateParams, prompt_ids: list[int]
    ) -> AsyncIterator[bytes]:
        rid, created, inc = r.new_id("cmpl-"), r.now(), params.include_usage
        sent = False
        async for ids in handle.chunks():
            # vLLM's `return_token_ids`: the prompt's ids in the first chunk's choice only
            both = ((None if sent else prompt_ids), list(ids)) if params.token_ids else None
            sent = True
            finish = handle.finish_reason if handle.finished else None
            text = self.codec.decode(ids)
            yield r.sse_data(r.completion_chunk(rid, params.model, created, text, finish, include_usage=inc, ids=both))
        if not sent:
            yield r.sse_data(r.openai_error(EngineBusy("The engine's waiting queue is full; retry later.")))
            return
        if inc:
            yield r.sse_data(r.usage_chunk(rid, params.model, created, "text_completion", self._usage(handle)))
        yield r.SSE_DONE

    # -- OpenAI Responses ---------------------------------------------------------------

    async def responses(self, request: Request) -> Response:
        body = await read_json(request)
        arrived = time.perf_counter()  # the body in hand, as vLLM stamps a request's arrival
        params = ra.responses_params(body, self.served)
        prompt = ra.prompt_messages(body, params, self.responses_store)
        ids = await self.prompts.encode(self.codec.render_chat(prompt.messages), add_special_tokens=False)
        handle = self.engine.submit(ids, max_tokens=params.max_output_tokens, cache_salt=params.cache_salt, seed=None)
        self._front(arrived)
        if params.stream:
            return self._stream(self._response_events(handle, params, prompt), handle, arrived)
        tokens = await self._finish(handle)
        text, rid = self.codec.decode(tokens), r.new_id("resp_")
        usage = ra.usage(handle.prompt_tokens, len(tokens), handle.cached_tokens)
        message = ra.output_message(r.new_id("msg_"), text, "completed")
        out = ra.response_object(
            rid, params, r.now(), status="completed", output=[message], usage_body=usage,
            finish_reason=handle.finish_reason,
        )  # fmt: skip
        ra.store_response(self.responses_store, params, prompt, out, text)
        return json_response(out)

    async def _response_events(
        self, handle: RequestHandle, params: ra.ResponsesParams, prompt: ra.ResponsesPrompt
    ) -> AsyncIterator[bytes]:
        events = ra.ResponseEvents(params)
        started = False
        async for ids in handle.chunks():
            if not started:
                for name, event in events.start():
                    yield r.sse_event(name, event)
                started = True
            yield r.sse_event(*events.delta(self.codec.decode(ids)))
        if not started:
            yield r.sse_event("error", r.openai_error(EngineBusy("The engine's waiting queue is full; retry later.")))
            return
        usage = ra.usage(handle.prompt_tokens, len(handle.output_token_ids), handle.cached_tokens)
        final = events.final_response(usage, handle.finish_reason)
        # Stored before the final event goes out: a client may send the next turn as soon as it
        # reads `response.completed`, before this generator runs again.
        ra.store_response(self.responses_store, params, prompt, final, events.answer)
        for name, event in events.finish(final):
            yield r.sse_event(name, event)

    async def retrieve_response(self, request: Request) -> Response:
        rid = request.path_params["response_id"]
        return json_response(ra.stored_response(self.responses_store, rid).response)

    async def delete_response(self, request: Request) -> Response:
        rid = request.path_params["response_id"]
        if not self.responses_store.delete(rid):
            raise ResponseNotFound(rid)
        return json_response(ra.deleted_response(rid))

    async def response_input_items(self, request: Request) -> Response:
        rid = request.path_params["response_id"]
        return json_response(ra.input_items(rid, ra.stored_response(self.responses_store, rid)))

    # -- Anthropic messages -------------------------------------------------------------

    async def messages(self, request: Request) -> Response:
        body = await read_json(request)
        arrived = time.perf_counter()  # the body in hand, as vLLM stamps a request's arrival
        params = generate_params(body, self.served, anthropic=True)
        params = GenerateParams(params.model, params.max_tokens, params.stream, False, params.cache_salt, params.seed)
        text = self.codec.render_chat(anthropic_messages(body))
        handle = self._submit(await self.prompts.encode(text, add_special_tokens=False), params, arrived)
        if params.stream:
            return self._stream(self._anthropic_events(handle, params.model), handle, arrived)
        tokens = await self._finish(handle)
        usage = r.anthropic_usage(handle.prompt_tokens, handle.cached_tokens, len(tokens))
        out = r.anthropic_message(
            r.new_id("msg_"), params.model, self.codec.decode(tokens), handle.finish_reason, usage
        )
        return json_response(out)

    async def _anthropic_events(self, handle: RequestHandle, model: str) -> AsyncIterator[bytes]:
        started = False
        async for ids in handle.chunks():
            if not started:
                usage = r.anthropic_usage(handle.prompt_tokens, handle.cached_tokens, 1)
                message: dict[str, Any] = {
                    "id": r.new_id("msg_"), "type": "message", "role": "assistant", "content": [], "model": model,
                    "stop_reason": None, "stop_sequence": None, "usage": usage,
                }  # fmt: skip
                yield r.sse_event("message_start", {"type": "message_start", "message": message})
                block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
                yield r.sse_event("content_block_start", block)
                yield r.sse_event("ping", {"type": "ping"})
                started = True
            delta = {"type": "text_delta", "text": self.codec.decode(ids)}
            yield r.sse_event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        if not started:
            yield r.sse_event("error", r.anthropic_error(EngineBusy("Overloaded")))
            return
        yield r.sse_event("content_block_stop", {"type": "content_block_stop", "index": 0})
        final = r.anthropic_usage(handle.prompt_tokens, handle.cached_tokens, len(handle.output_token_ids))
        stop = {"stop_reason": r.anthropic_stop_reason(handle.finish_reason), "stop_sequence": None}
        yield r.sse_event("message_delta", {"type": "message_delta", "delta": stop, "usage": final})
        yield r.sse_event("message_stop", {"type": "message_stop"})

    # -- tokenizer, embeddings, admin -----------------------------------------------------

    async def tokenize(self, request: Request) -> Response:
        body = await read_json(request)
        if body.get("model") is not None:
            resolve_model(body, self.served)
        req = tokenize_request(body)
        timing = self.engine.config.timing
        if timing.tokenize_s > 0:  # a busy API server answers late; the engine serves on meanwhile
            await asyncio.sleep(timing.tokenize_s * timing.time_scale)
        if req.messages is not None:
            text = self.codec.render_chat(
                req.messages,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
            )
        else:
            text = req.text or ""
        ids = await self.prompts.encode(text, add_special_tokens=req.add_special_tokens)
        strs = self.codec.token_strings(ids) if req.return_token_strs else None
        out = {"count": len(ids), "max_model_len": self.engine.config.max_model_len, "tokens": ids, "token_strs": strs}
        return json_response(out)

    async def detokenize(self, request: Request) -> Response:
        body = await read_json(request)
        if body.get("model") is not None:
            resolve_model(body, self.served)
        ids = detokenize_tokens(body, self.codec.vocab_size)
        return json_response({"prompt": self.codec.decode(ids)})

    async def embeddings(self, request: Request) -> Response:
        body = await read_json(request)
        dim = self.engine.config.embedding_dim
        req = embedding_request(body, self.served, dim)
        data, total = [], 0
        for index, item in enumerate(req.inputs):
            if isinstance(item, str):
                text, count = item, len(await self.prompts.encode(item, add_special_tokens=True))
            else:
                text, count = self.codec.decode(self._check_ids(item)), len(item)
            total += count
            vec = emb.truncate(emb.embed(text, dim), req.dimensions)
            value: Any = emb.encode_base64(vec) if req.encoding_format == "base64" else vec.tolist()
            data.append({"object": "embedding", "index": index, "embedding": value})
        out = {
            "object": "list",
            "data": data,
            "model": req.model,
            "usage": {"prompt_tokens": total, "total_tokens": total},
        }
        return json_response(out)

    async def reset_prefix_cache(self, _request: Request) -> Response:
        if self.engine.reset_prefix_cache():
            return Response(status_code=200)
        raise Conflict("Cannot reset the prefix cache while requests hold KV blocks.")

    async def sim_reset(self, _request: Request) -> Response:
        if self.engine.reset():
            return Response(status_code=200)
        raise Conflict("Cannot reset the engine while requests hold KV blocks.")

    async def models(self, _request: Request) -> Response:
        return json_response(r.models_list(self.served, self.engine.config.max_model_len, self.created))

    async def health(self, _request: Request) -> Response:
        return Response(status_code=200)

    async def version(self, _request: Request) -> Response:
        return json_response({"version": SIM_VERSION})

    async def metrics(self, _request: Request) -> Response:
        return Response(self.engine.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def request_times(self, _request: Request) -> Response:
        """The stamps of the chat and completion requests that carried an `x-request-id` since the
        last call (docs/sim-engine.md, "HTTP API"); reading clears them."""
        return json_response(self.times.drain())


def build_app(engine: SimEngine, prompts: PromptTokens, served_models: list[str] | None = None) -> FastAPI:
    """`prompts`: the engine's prompt tokenizer (its owner closes it)."""
    store = ResponseStore(engine.config.responses_store)  # one per engine, as each vLLM has its own
    api = EngineApi(engine, served_models or [engine.config.model], store, prompts)
    app = FastAPI(title=f"continuum-sim {engine.config.name}", docs_url=None, redoc_url=None, openapi_url=None)
    post = {
        "/v1/chat/completions": _guard(api.chat),
        "/v1/completions": _guard(api.completions),
        "/v1/responses": _guard(api.responses),
        "/v1/messages": _guard(api.messages, anthropic=True),
        "/v1/embeddings": _guard(api.embeddings),
        "/tokenize": _guard(api.tokenize),
        "/detokenize": _guard(api.detokenize),
        "/reset_prefix_cache": _guard(api.reset_prefix_cache),
        "/sim/reset": _guard(api.sim_reset),
    }
    get = {
        "/v1/models": api.models,
        "/health": api.health,
        "/version": api.version,
        "/metrics": api.metrics,
        "/sim/request-times": api.request_times,
        "/v1/responses/{response_id}": _guard(api.retrieve_response),
        "/v1/responses/{response_id}/input_items": _guard(api.response_input_items),
    }
    delete = {"/v1/responses/{response_id}": _guard(api.delete_response)}
    for method, routes in (("POST", post), ("GET", get), ("DELETE", delete)):
        for path, handler in routes.items():
            app.add_api_route(path, handler, methods=[method], include_in_schema=False)
    return app
