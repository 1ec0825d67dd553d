"""A step scheduler after vLLM v1's (`vllm/v1/core/sched/scheduler.py`), simplified.

Each step has a token budget (`max_num_batched_tokens`). Running requests go first, in arrival
order: a decoding request costs one token of budget, a request still prefilling takes the next
chunk of its prompt (chunked prefill). Then waiting requests are admitted first-come first-served
while the budget lasts and fewer than `max_num_seqs` run: the prefix cache is looked up, blocks
are allocated and newly full blocks cached. When a running request cannot get a block, the most
recently admitted running request is preempted (its blocks freed, its progress recomputed later,
as vLLM's RECOMPUTE preemption does).

`decode_tokens` > 1 lets one step stand for several decode iterations (the engine raises it when
time is compressed so far that one real iteration per simulated token would be too short).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from continuum_sim.policy.kv_manager import KVCacheManager
from continuum_sim.policy.request import RequestStatus, SimRequest


class QueueFull(Exception):
    """The waiting queue is at `max_waiting`."""


@dataclass
class ScheduledStep:
    prefill: list[tuple[SimRequest, int]] = field(default_factory=list)
    decode: list[SimRequest] = field(default_factory=list)
    decode_tokens: int = 1
    preempted: list[SimRequest] = field(default_factory=list)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for _, n in self.prefill)

    @property
    def num_decode_seqs(self) -> int:
        return len(self.decode)

    @property
    def context_tokens(self) -> int:
        return sum(r.num_computed for r in self.decode)

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode


@dataclass
class StepOutput:
    request: SimRequest
    new_token_ids: list[int]
    finished: bool


class Scheduler:
    def __init__(self, kv: KVCacheManager, *, max_num_seqs: int, max_num_batched_tokens: int, max_waiting: int) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_waiting = max_waiting
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.num_preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: SimRequest) -> None:
        if len(self.waiting) >= self.max_waiting:
            raise QueueFull(len(self.waiting))
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def abort(self, request: SimRequest) -> None:
        """Stop a request. Waiting ones leave at once; running ones at the next step boundary,
        because the step that may be executing still references them."""
        if request.status in (RequestStatus.FINISHED, RequestStatus.ABORTED):
            return
        request.aborted = True
        if request.status == RequestStatus.WAITING:
            self.waiting.remove(request)
            request.status = RequestStatus.ABORTED

    def _drop_aborted(self) -> None:
        if any(r.aborted for r in self.running):
            for request in self.running:
                if request.aborted:
                    self.kv.free(request)
                    request.status = RequestStatus.ABORTED
            self.running = [r for r in self.running if not r.aborted]

    def schedule(self, decode_tokens: int = 1) -> ScheduledStep:
        self._drop_aborted()
        step = ScheduledStep(decode_tokens=max(1, decode_tokens))
        budget = self.max_num_batched_tokens
        budget = self._schedule_running(step, budget)
        if not step.preempted:
            self._schedule_waiting(step, budget)
        return step

    def _schedule_running(self, step: ScheduledStep, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            if request.is_decoding:
                num_new = min(step.decode_tokens, request.max_tokens - request.num_output)
                cost = 1
            else:
                num_new = min(request.num_tokens - request.num_computed, budget)
                cost = num_new
            while not self.kv.allocate_slots(request, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                step.preempted.append(victim)
                if victim is request:
                    return budget
            if request.is_decoding:
                step.decode.append(request)
            else:
                step.prefill.append((request, num_new))
            budget -= cost
            index += 1
        return budget

    def _preempt(self, request: SimRequest) -> None:
        self.kv.free(request)
        request.num_computed = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _schedule_waiting(self, step: ScheduledStep, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            hit_blocks, hit_tokens = self.kv.get_computed_blocks(request)
            num_new = min(request.num_tokens - hit_tokens, budget)
            if not self.kv.allocate_slots(request, num_new, hit_blocks):
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            request.num_computed = hit_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = hit_tokens
                self.kv.record_query(request, hit_tokens)
            self.running.append(request)
            step.prefill.append((request, num_new))
            budget -= num_new

    def complete(self, step: ScheduledStep) -> list[StepOutput]:
        """Apply the step's results: computed tokens advance, new tokens are emitted, finished
        requests release their blocks."""
        outputs: list[StepOutput] = []
        for request, num_new in step.prefill:
            if request.aborted or request.status != RequestStatus.RUNNING:
                continue
            request.num_computed += num_new
            if request.num_computed >= request.num_tokens:
                outputs.append(StepOutput(request, request.emit(1), False))
        for request in step.decode:
            if request.aborted or request.status != RequestStatus.RUNNING:
                continue
            count = min(step.decode_tokens, request.max_tokens - request.num_output)
            request.num_computed += count
            outputs.append(StepOutput(request, request.emit(count), False))
        finished = False
        for output in outputs:
            if output.request.done:
                output.finished = True
                output.request.status = RequestStatus.FINISHED
                self.kv.free(output.request)
                finished = True
        if finished:
            self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]
        self._drop_aborted()
        return outputs
