"""The engine core: the scheduler's step loop on the event loop, in scaled time.

`SimEngine.submit()` turns a tokenized prompt into a `RequestHandle`; the step loop schedules,
"executes" by sleeping the step's simulated duration × `time_scale`, then delivers the new
tokens to the handles and publishes the step's KV events as one batch (what vLLM's
`update_from_output` does). When the loop falls behind its schedule (CPU-bound at very small
time scales) it drops the debt instead of racing, and reports the lag in a gauge.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from continuum_sim.config import EngineConfig
from continuum_sim.errors import EngineBusy, InvalidRequest
from continuum_sim.metrics import EngineMetrics
from continuum_sim.policy.block_pool import BlockPool
from continuum_sim.policy.kv_manager import KVCacheManager
from continuum_sim.policy.request import RequestStatus, SimRequest
from continuum_sim.policy.scheduler import QueueFull, ScheduledStep, Scheduler, StepOutput
from continuum_sim.protocol.block_hash import none_hash
from continuum_sim.protocol.codec import PromptCodec
from continuum_sim.protocol.kv_wire import KvEvent

log = logging.getLogger(__name__)
_MAX_CARRIED_LAG_S = 0.05


class EventSink(Protocol):
    def publish(self, events: Sequence[KvEvent]) -> None: ...

    def forget(self) -> None:
        """Drop the event history kept for replay (sequence numbers go on)."""


class RequestHandle:
    """What the HTTP layer holds while a request runs: new tokens arrive in `push`."""

    def __init__(self, request: SimRequest, arrival: float) -> None:
        self.request = request
        self.arrival = arrival
        self.first_token_at: float | None = None
        self.finished = False
        self._pending: list[int] = []
        self._ready = asyncio.Event()

    @property
    def prompt_tokens(self) -> int:
        return self.request.num_prompt_tokens

    @property
    def cached_tokens(self) -> int:
        return max(self.request.num_cached_tokens, 0)

    @property
    def finish_reason(self) -> str:
        return self.request.finish_reason

    @property
    def output_token_ids(self) -> list[int]:
        return self.request.output_token_ids

    def push(self, token_ids: list[int], finished: bool) -> None:
        self._pending += token_ids
        self.finished = self.finished or finished
        self._ready.set()

    async def chunks(self) -> AsyncIterator[list[int]]:
        """Token batches as the engine produces them, until the request finishes."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            pending, self._pending = self._pending, []
            if pending:
                yield pending
            if self.finished:
                return

    async def wait(self) -> list[int]:
        async for _ in self.chunks():
            pass
        return self.output_token_ids


class SimEngine:
    def __init__(self, config: EngineConfig, codec: PromptCodec, *, events: EventSink | None = None) -> None:
        self.config = config
        self.codec = codec
        self.generator = codec.generator
        self.metrics = EngineMetrics(config.model)
        self.events = events
        self.pool = BlockPool(
            config.num_gpu_blocks,
            config.block_size,
            enable_caching=config.enable_prefix_caching,
            events_enabled=config.kv_events.enabled,
            event_hash="sglang" if config.kv_events.era == "sglang" else "vllm",
        )
        self.kv = KVCacheManager(self.pool)
        self.scheduler = Scheduler(
            self.kv,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_waiting=config.max_waiting,
        )
        self._root = none_hash(config.python_hash_seed)
        self._ids = itertools.count()
        self._handles: dict[int, RequestHandle] = {}
        self._wake = asyncio.Event()
        self.steps = 0
        self._synced_queries = 0
        self._synced_hits = 0

    # -- requests -----------------------------------------------------------------------

    def check_length(self, num_prompt_tokens: int, max_tokens: int | None) -> None:
        limit = self.config.max_model_len
        wanted = num_prompt_tokens + (max_tokens or 1)
        if wanted > limit:
            self.metrics.rejected.labels("too_long").inc()
            raise InvalidRequest(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{wanted} tokens ({num_prompt_tokens} in the messages, {max_tokens or 1} in the completion). "
                "Please reduce the length of the messages or completion.",
                param="max_tokens" if max_tokens else "messages",
            )

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int | None = None,
        cache_salt: str | None = None,
        seed: int | None = None,
        request_id: str | None = None,
    ) -> RequestHandle:
        """Queue a request; it enters the scheduler after the request overhead (scaled)."""
        if not prompt_token_ids:
            raise InvalidRequest("The prompt is empty.", param="prompt")
        self.check_length(len(prompt_token_ids), max_tokens)
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            self.metrics.rejected.labels("queue_full").inc()
            raise EngineBusy("The engine's waiting queue is full; retry later.")
        if max_tokens is None:
            low, high = self.config.default_max_tokens
            count, reason = self.generator.default_length(prompt_token_ids, low, high), "stop"
        else:
            count, reason = max_tokens, "length"
        plan = self.generator.answer(prompt_token_ids, count, seed)
        loop = asyncio.get_running_loop()
        request = SimRequest(
            request_id or f"req-{next(self._ids)}",
            prompt_token_ids,
            plan,
            block_size=self.config.block_size,
            hash_root=self._root,
            cache_salt=cache_salt,
            finish_reason=reason,
            arrival_time=loop.time(),
        )
        handle = RequestHandle(request, loop.time())
        self._handles[id(request)] = handle
        timing = self.config.timing
        loop.call_later(timing.request_overhead_s * timing.time_scale, self._enqueue, request)
        return handle

    def _enqueue(self, request: SimRequest) -> None:
        if request.aborted:
            return
        try:
            self.scheduler.add(request)
        except QueueFull:
            self.metrics.rejected.labels("queue_full").inc()
            handle = self._handles.pop(id(request), None)
            request.status = RequestStatus.ABORTED
            if handle is not None:
                handle.push([], True)
            return
        self.metrics.waiting.set(len(self.scheduler.waiting))
        self._wake.set()

    def abort(self, handle: RequestHandle) -> None:
        if handle.finished:
            return
        request = handle.request
        self._handles.pop(id(request), None)
        if request.status == RequestStatus.WAITING and request not in self.scheduler.waiting:
            request.aborted = True  # still in its overhead delay
        else:
            self.scheduler.abort(request)
        self.metrics.aborted.inc()
        self._wake.set()

    def reset_prefix_cache(self) -> bool:
        """vLLM's POST /reset_prefix_cache: refused while any request holds blocks."""
        done = self.pool.reset()
        if done:
            self._publish_pending()
        return done

    def reset(self) -> bool:
        """As a freshly started engine (the simulator's POST /sim/reset): the prefix cache
        emptied, as `reset_prefix_cache` does, the KV event history kept for replay
        forgotten, so a subscriber that starts now replays nothing from before, and the
        tokenizer's caches emptied, so the next run pays for its tokenization as the first one
        did. Refused while any request holds blocks."""
        if not self.reset_prefix_cache():
            return False
        if self.events is not None:
            self.events.forget()
        self.codec.clear_caches()
        return True

    # -- the step loop --------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        timing = self.config.timing
        next_start = loop.time()
        while True:
            if not self.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                next_start = loop.time()
                continue
            step = self.scheduler.schedule(self._decode_tokens())
            self._update_gauges()
            if step.empty:
                self._publish_pending()
                self._wake.clear()
                await self._wake.wait()
                next_start = loop.time()
                continue
            duration = timing.step_s(
                step.num_prefill_tokens, step.num_decode_seqs, step.context_tokens, step.decode_tokens
            )
            target = next_start + duration * timing.time_scale
            delay = target - loop.time()
            await asyncio.sleep(max(delay, 0.0))
            lag = loop.time() - target
            self.metrics.step_lag.set(max(lag, 0.0))
            next_start = target if lag < _MAX_CARRIED_LAG_S else loop.time()
            self._finish_step(step, self.scheduler.complete(step), loop.time())

    def _decode_tokens(self) -> int:
        decoding = [r for r in self.scheduler.running if r.is_decoding]
        if not decoding:
            return 1
        context = sum(r.num_computed for r in decoding)
        return self.config.timing.decode_tokens_per_step(len(decoding), context)

    def _finish_step(self, step: ScheduledStep, outputs: list[StepOutput], now: float) -> None:
        self.steps += 1
        scale = self.config.timing.time_scale
        metrics = self.metrics
        if step.preempted:
            metrics.preemptions.inc(len(step.preempted))
        for output in outputs:
            request = output.request
            handle = self._handles.get(id(request))
            if handle is None:
                continue
            if handle.first_token_at is None and output.new_token_ids:
                handle.first_token_at = now
                metrics.ttft.observe((now - handle.arrival) / scale)
                metrics.prompt_tokens.inc(request.num_prompt_tokens)
            metrics.generation_tokens.inc(len(output.new_token_ids))
            if output.finished:
                del self._handles[id(request)]
                metrics.e2e.observe((now - handle.arrival) / scale)
                metrics.success(request.finish_reason)
            handle.push(output.new_token_ids, output.finished)
        self._publish_pending()
        self._update_gauges()

    def _sync_prefix_counters(self) -> None:
        # The counters mirror the KV manager's stats, which count at admission like vLLM.
        stats = self.kv.stats
        self.metrics.prefix_queries.inc(stats.queries - self._synced_queries)
        self.metrics.prefix_hits.inc(stats.hits - self._synced_hits)
        self._synced_queries, self._synced_hits = stats.queries, stats.hits

    def _publish_pending(self) -> None:
        events = self.pool.take_events()
        if events and self.events is not None:
            self.events.publish(events)

    def _update_gauges(self) -> None:
        self._sync_prefix_counters()
        self.metrics.running.set(len(self.scheduler.running))
        self.metrics.waiting.set(len(self.scheduler.waiting))
        self.metrics.kv_usage.set(self.pool.usage())
        self.metrics.cached_hashes.set(self.pool.num_cached_hashes)
