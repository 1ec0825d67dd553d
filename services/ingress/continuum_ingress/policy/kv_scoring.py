"""The KV overlap score (seed §"Overlap 스코어링"), pure.

    final = overlap_weight · (raw_overlap · tier_multiplier)
          + load_weight    · (1 − load_ratio)
          + health_weight  · success_rate

* raw_overlap = the holder's token count / the largest token count among the prefix's holders;
* tier_multiplier = gpu_tier_weight for a GPU-resident copy, storage_tier_weight for a warm one;
* load_ratio = the backend's in-flight requests / the most in flight on any backend of the load
  snapshot (0 when nothing is in flight);
* only holders get a score; a holder whose raw_overlap · tier_multiplier is below
  min_overlap_threshold scores 0, like a backend that holds nothing.

A *provisional* holder (a speculative entry: this ingress just sent the prefix there, the
engine's own event has not arrived yet) counts as a GPU-resident holder with raw_overlap 1.0,
unless the index already reports that backend, in which case the index's row is used.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from continuum_common.config.kv_index import Scoring
from continuum_common.events import Tier
from continuum_ingress.policy.scorer import HoldingTier


@dataclass(frozen=True, slots=True)
class Weights:
    overlap: float = 0.6
    load: float = 0.3
    health: float = 0.1
    min_overlap: float = 0.3
    gpu_tier: float = 1.0
    storage_tier: float = 0.6

    @classmethod
    def from_config(cls, cfg: Scoring) -> Weights:
        return cls(
            overlap=cfg.overlap_weight,
            load=cfg.load_weight,
            health=cfg.health_weight,
            min_overlap=cfg.min_overlap_threshold,
            gpu_tier=cfg.gpu_tier_weight,
            storage_tier=cfg.storage_tier_weight,
        )


@dataclass(frozen=True, slots=True)
class LoadSample:
    in_flight: int
    success_rate: float


@dataclass(frozen=True, slots=True)
class Holding:
    backend: str
    token_count: int
    tier: Tier
    speculative: bool = False


Scores = dict[str, tuple[float, HoldingTier]]


def holding_tier(tier: Tier) -> HoldingTier:
    return HoldingTier.GPU_HOT if tier is Tier.GPU_HOT else HoldingTier.STORAGE_WARM


def merge_provisional(real: Iterable[Holding], provisional: Iterable[str]) -> list[Holding]:
    """The index's rows plus a provisional row for each backend the index does not list."""
    rows = list(real)
    known = {h.backend for h in rows}
    rows.extend(Holding(b, 0, Tier.GPU_HOT, speculative=True) for b in provisional if b not in known)
    return rows


def composite_scores(holders: Iterable[Holding], loads: Mapping[str, LoadSample], weights: Weights) -> Scores:
    """Score and tier of every holder that is in the load snapshot (the candidates)."""
    rows = list(holders)
    max_tokens = max((h.token_count for h in rows if not h.speculative), default=0)
    max_load = max((s.in_flight for s in loads.values()), default=0)
    out: Scores = {}
    for h in rows:
        sample = loads.get(h.backend)
        if sample is None:
            continue  # not a candidate for this request (unhealthy, excluded, other model)
        raw = 1.0 if h.speculative else (h.token_count / max_tokens if max_tokens > 0 else 0.0)
        overlap = raw * (weights.gpu_tier if h.tier is Tier.GPU_HOT else weights.storage_tier)
        tier = holding_tier(h.tier)
        if overlap < weights.min_overlap:
            out[h.backend] = (0.0, tier)
            continue
        load_ratio = sample.in_flight / max_load if max_load > 0 else 0.0
        health = min(max(sample.success_rate, 0.0), 1.0)
        score = weights.overlap * overlap + weights.load * (1.0 - load_ratio) + weights.health * health
        out[h.backend] = (score, tier)
    return out
