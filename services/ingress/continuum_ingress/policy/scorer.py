"""The Tier 4 KV scorer contract (seed §"비동기 준비 모델 및 보유 계층 기록").

The pipeline runs a registered scorer before the configured strategy, only when the request has
a prefix key. `prepare()` is the one async step (index query + a load snapshot, cached briefly by
the scorer); `score()` / `score_with_tier()` are synchronous reads of what prepare fetched. The
best composite score must be strictly greater than 0.3 for the scorer to decide; otherwise the
configured selection_strategy chooses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, Protocol, runtime_checkable

from continuum_ingress.policy.strategies import CandidateView

SCORER_THRESHOLD = 0.3  # seed DEFAULT_SCORER_THRESHOLD, compared with `>`


class HoldingTier(StrEnum):
    """Where the chosen backend holds the prefix (the `tier` label of the KV routing metric)."""

    GPU_HOT = "gpu_hot"
    STORAGE_WARM = "storage_warm"
    NONE = "none"


class BackendScorer(Protocol):
    async def prepare(self, prefix_key: bytes, candidates: Sequence[CandidateView]) -> None:
        """Fetch what score() will read for this prefix key (must bound its own I/O time)."""

    def score(self, prefix_key: bytes, backend: str) -> float:
        """Composite score in [0, 1]; 0.0 for a backend that does not hold the prefix."""

    def score_with_tier(self, prefix_key: bytes, backend: str) -> tuple[float, HoldingTier]:
        """Score and holding tier from one read, so a concurrent prepare() cannot split them."""


@runtime_checkable
class DecisionObserver(Protocol):
    """Optional for a scorer: told where a request with a prefix key went, after a KV-aware
    decision or a PrefixAwareHash one (labels prefix_hash / overflow), e.g. to record a
    speculative index entry before the engine's KV event arrives."""

    def note_decision(self, prefix_key: bytes, backend: str, decision: Literal["kv_aware", "prefix_hash"]) -> None: ...


@dataclass(frozen=True, slots=True)
class ScoredChoice:
    backend: str
    score: float
    tier: HoldingTier


def best_scored(scorer: BackendScorer, prefix_key: bytes, candidates: Sequence[CandidateView]) -> ScoredChoice | None:
    """The best candidate when its score passes the pool threshold (strictly), else None.
    Ties keep the earlier candidate (config order), so the decision is deterministic."""
    best: ScoredChoice | None = None
    for c in candidates:
        score, tier = scorer.score_with_tier(prefix_key, c.name)
        if best is None or score > best.score:
            best = ScoredChoice(c.name, score, tier)
    if best is None or not best.score > SCORER_THRESHOLD:
        return None
    return best
