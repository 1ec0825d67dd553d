"""Detokenize attribution: turn a tracker Job (chain tokens) into a prefix key.

The job's tokens run from the chain root to its deepest new block. One /detokenize call tells
whether that depth determines the anchor (protocol.templates). When it does, the first block of
the run that already determines it is found by bisection over the run's block depths (decoded
prefixes only grow, so "determined" is monotonic along a chain): at most ⌈log2(run length)⌉
extra calls, each answered from a small cache when the same block was asked before. Only blocks
at or past that point are attributed — a shallower block may be a prompt head that several system
prompts share, and a child inherits its parent's key, so attributing it would be wrong.

The cache is keyed by block hash: an engine block hash identifies the exact token prefix, so
the answer for it never changes (also across engine restarts).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

from continuum_common.hashing import prefix_key_from_text
from continuum_listener.errors import DetokenizeError
from continuum_listener.policy.chains import Job, Outcome, Resolution
from continuum_listener.protocol.templates import Anchor, AnchorStatus, split_anchor

Detokenize = Callable[[Sequence[int]], Awaitable[str]]


class Resolver:
    def __init__(
        self,
        *,
        detokenize: Detokenize,
        family: str,
        model: str,
        max_prefix_length: int,
        cache_size: int = 4096,
        on_outcome: Callable[[str], None] | None = None,
    ) -> None:
        self._detokenize = detokenize
        self._family = family
        self._model = model
        self._max = max_prefix_length
        self._cache: OrderedDict[int, Anchor] = OrderedDict()
        self._cache_size = cache_size
        self._on_outcome = on_outcome or (lambda _outcome: None)

    async def _anchor(self, job: Job, index: int) -> Anchor:
        key = job.run[index]
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self._on_outcome("cache_hit")
            return cached
        assert job.tokens is not None, "materialize the job first"
        text = await self._detokenize(job.tokens[: job.depths[index]])
        anchor = split_anchor(self._family, text, self._max)
        self._cache[key] = anchor
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return anchor

    async def resolve(self, job: Job) -> Resolution:
        try:
            deepest = await self._anchor(job, len(job.run) - 1)
            if deepest.status is AnchorStatus.PENDING:
                self._on_outcome("pending")
                return Resolution(Outcome.PENDING)
            if deepest.status is not AnchorStatus.DETERMINED:
                self._on_outcome("unattributable")
                return Resolution(Outcome.UNATTRIBUTABLE)
            low, high = 0, len(job.run) - 1
            while low < high:
                mid = (low + high) // 2
                if (await self._anchor(job, mid)).status is AnchorStatus.DETERMINED:
                    high = mid
                else:
                    low = mid + 1
        except DetokenizeError:
            self._on_outcome("failed")
            return Resolution(Outcome.FAILED)
        prefix = prefix_key_from_text(
            job.model or self._model, deepest.text, tag=deepest.tag, max_prefix_length=self._max
        )
        if prefix is None:
            self._on_outcome("unattributable")
            return Resolution(Outcome.UNATTRIBUTABLE)
        self._on_outcome("determined")
        return Resolution(Outcome.DETERMINED, high, prefix)
