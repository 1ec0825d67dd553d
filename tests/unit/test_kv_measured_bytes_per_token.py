"""A precise group without a local tokenizer estimates the size of requests it matches
approximately from what the engines' /tokenize answered, not from the configured ratio."""

from __future__ import annotations

import orjson

from continuum_common.config.kv_index import KvCacheIndex
from continuum_ingress.kv.groups import MAX_BYTES_PER_TOKEN, GroupRuntime
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.requests import parse_request
from continuum_ingress.state import RequestState


def _group() -> GroupRuntime:
    section = KvCacheIndex.model_validate(
        {"enabled": True, "groups": [{"name": "g", "models": ["m"], "mode": "precise", "hash_seed": "0"}]}
    )
    return GroupRuntime("g", section, section.groups[0])


def _completion(prompt: str) -> RequestState:
    raw = orjson.dumps({"model": "m", "prompt": prompt})
    return RequestState("req-1", parse_request(Api.COMPLETIONS, raw), raw, None, [], None, 0.0)  # type: ignore[arg-type]


def test_estimates_follow_the_measured_ratio() -> None:
    group = _group()
    state = _completion("x" * 8000)
    configured = group.approximate_keys(state)
    assert configured.prompt_tokens == 2000  # 4 bytes per token, the configured default
    assert configured.tokens_per_key == 256 / 4

    for _ in range(5):
        group.measured(10_000, 1_250)  # the engines answer 8 bytes per token
    measured = group.approximate_keys(state)
    assert measured.prompt_tokens == 1000
    assert measured.tokens_per_key == 256 / 8
    assert measured.chain == configured.chain  # the chunks matched are the same


def test_recent_answers_weigh_most_and_odd_ones_are_bounded() -> None:
    group = _group()
    for _ in range(500):
        group.measured(8_000, 1_000)
    group.measured(3_000, 1_000)  # one request at 3 bytes per token moves the ratio a little
    assert 7.9 < group.bytes_per_token < 8.0
    for _ in range(500):
        group.measured(3_000, 1_000)
    assert abs(group.bytes_per_token - 3.0) < 0.05
    group.measured(0, 10)  # nothing to learn from
    group.measured(10, 0)
    assert abs(group.bytes_per_token - 3.0) < 0.05
    for _ in range(2_000):
        group.measured(1 << 30, 1)
    assert group.bytes_per_token == MAX_BYTES_PER_TOKEN
