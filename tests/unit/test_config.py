"""Configuration schema: defaults, ranges, dotted error paths, the seed's warnings, the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from continuum_common.config import (
    ListenerConfig,
    RouterConfig,
    SelectionStrategy,
    format_duration,
    load_router_config,
    parse,
    parse_duration,
    router_warnings,
)
from continuum_common.errors import ConfigError
from continuum_router.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]


def problems_of(data: dict, model: type = RouterConfig) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(model, data)
    return info.value.problems


def test_a_precise_group_routes_new_prompts_off_the_path_by_default() -> None:
    group = {"name": "g", "backends": ["a"], "mode": "precise", "engine": "vllm", "hash_seed": "0"}
    cfg = parse(RouterConfig, {"backends": [{"name": "a", "url": "http://a"}], "kv_cache_index": {"groups": [group]}})
    (parsed,) = cfg.kv_cache_index.groups
    assert parsed.tokenize_new_prompts == "off_path" and parsed.tokenize_wait_ms is None
    on = parse(
        RouterConfig,
        {
            "backends": [{"name": "a", "url": "http://a"}],
            "kv_cache_index": {"groups": [{**group, "tokenize_new_prompts": "on_path"}]},
        },
    )
    assert on.kv_cache_index.groups[0].tokenize_new_prompts == "on_path"


def test_defaults_match_the_seed() -> None:
    cfg = RouterConfig()
    assert cfg.prefix_routing.enabled is False
    assert cfg.prefix_routing.max_prefix_length == 1024
    assert cfg.prefix_routing.load_factor_epsilon == 0.25
    assert cfg.prefix_routing.virtual_nodes == 150
    assert cfg.response_cache.capacity == 1000
    assert cfg.response_cache.ttl == 300
    assert cfg.response_cache.max_response_size == 1_048_576
    assert cfg.response_cache.max_stream_buffer_size == 10_485_760
    assert cfg.kv_cache_index.max_entries == 100_000
    assert cfg.kv_cache_index.entry_ttl_seconds == 600
    s = cfg.kv_cache_index.scoring
    assert (s.overlap_weight, s.load_weight, s.health_weight) == (0.6, 0.3, 0.1)
    assert (s.min_overlap_threshold, s.gpu_tier_weight, s.storage_tier_weight) == (0.3, 1.0, 0.6)
    assert cfg.kv_cache_index.storage_offloading.treat_eviction_as_offload is True
    g = cfg.gemini_context_cache
    assert (g.enabled, g.min_prefix_bytes, g.ttl, g.max_entries) == (False, 16384, 600, 1000)
    assert (g.create_timeout_ms, g.negative_ttl_seconds, g.prefer_native_api) == (5000, 600, False)
    sem = cfg.response_cache.semantic
    assert (sem.max_entries, sem.embedding_timeout_ms, sem.max_input_bytes) == (1000, 2000, 8192)
    assert cfg.selection_strategy is SelectionStrategy.ROUND_ROBIN


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"prefix_routing": {"load_factor_epsilon": 0.001}}, "prefix_routing.load_factor_epsilon"),
        ({"prefix_routing": {"load_factor_epsilon": 10.5}}, "prefix_routing.load_factor_epsilon"),
        ({"kv_cache_index": {"max_entries": 99}}, "kv_cache_index.max_entries"),
        ({"kv_cache_index": {"max_entries": 10_000_001}}, "kv_cache_index.max_entries"),
        ({"kv_cache_index": {"entry_ttl_seconds": 0}}, "kv_cache_index.entry_ttl_seconds"),
        ({"kv_cache_index": {"entry_ttl_seconds": 86401}}, "kv_cache_index.entry_ttl_seconds"),
        ({"kv_cache_index": {"scoring": {"overlap_weight": 0.7}}}, "kv_cache_index.scoring.overlap_weight"),
        ({"gemini_context_cache": {"min_prefix_bytes": 1023}}, "gemini_context_cache.min_prefix_bytes"),
        ({"gemini_context_cache": {"ttl": "59s"}}, "gemini_context_cache.ttl"),
        ({"gemini_context_cache": {"max_entries": 9}}, "gemini_context_cache.max_entries"),
        ({"gemini_context_cache": {"max_entries": 1_000_001}}, "gemini_context_cache.max_entries"),
        ({"gemini_context_cache": {"create_timeout_ms": 499}}, "gemini_context_cache.create_timeout_ms"),
        ({"gemini_context_cache": {"create_timeout_ms": 60001}}, "gemini_context_cache.create_timeout_ms"),
        ({"gemini_context_cache": {"negative_ttl_seconds": 0}}, "gemini_context_cache.negative_ttl_seconds"),
        ({"response_cache": {"semantic": {"threshold": 1.5}}}, "response_cache.semantic.threshold"),
        ({"response_cache": {"semantic": {"max_entries": 0}}}, "response_cache.semantic.max_entries"),
        (
            {"response_cache": {"semantic": {"embedding_timeout_ms": 99}}},
            "response_cache.semantic.embedding_timeout_ms",
        ),
        ({"response_cache": {"semantic": {"max_input_bytes": 1_048_577}}}, "response_cache.semantic.max_input_bytes"),
        ({"response_cache": {"redis": {"key_prefix": "cr:*"}}}, "response_cache.redis.key_prefix"),
        ({"response_cache": {"redis": {"key_prefix": "cr[1]"}}}, "response_cache.redis.key_prefix"),
        ({"response_cache": {"ttl": "five minutes"}}, "response_cache.ttl"),
        (
            {"kv_cache_index": {"event_sources": [{"backend_name": "a b", "endpoint": "http://x"}]}},
            "kv_cache_index.event_sources[0].backend_name",
        ),
        (
            {"kv_cache_index": {"event_sources": [{"backend_name": "a", "endpoint": "ftp://x"}]}},
            "kv_cache_index.event_sources[0].endpoint",
        ),
        ({"kv_cache_index": {"event_sources": [{"backend_name": "a"}]}}, "kv_cache_index.event_sources[0].endpoint"),
        ({"selection_strategy": "Fastest"}, "selection_strategy"),
        ({"backends": [{"name": "a", "url": "http://x", "type": "bedrock"}]}, "backends[0].type"),
        ({"backends": [{"name": "a", "url": "x"}]}, "backends[0].url"),
        ({"backends": [{"name": "a", "url": "http://x", "api_key": "sk-secret"}]}, "backends[0].api_key"),
        ({"prefix_routing": {"enabeld": True}}, "prefix_routing.enabeld"),
        ({"prefix_routing": {"virtual_nodes": "many"}}, "prefix_routing.virtual_nodes"),
    ],
)
def test_invalid_values_report_their_dotted_path(data: dict, path: str) -> None:
    problems = problems_of(data)
    assert any(p.startswith(path + ":") for p in problems), problems


def test_every_problem_is_reported_not_just_the_first() -> None:
    problems = problems_of(
        {"prefix_routing": {"virtual_nodes": 0}, "kv_cache_index": {"max_entries": 1}, "extra_section": {}}
    )
    assert len(problems) == 3


def test_boundaries_are_inclusive() -> None:
    cfg = parse(
        RouterConfig,
        {
            "prefix_routing": {"load_factor_epsilon": 0.01},
            "kv_cache_index": {"max_entries": 100, "entry_ttl_seconds": 86400},
            "gemini_context_cache": {
                "min_prefix_bytes": 1024,
                "ttl": "1m",
                "max_entries": 10,
                "create_timeout_ms": 500,
                "negative_ttl_seconds": 1,
            },
        },
    )
    assert cfg.gemini_context_cache.ttl == 60


def test_weights_tolerate_float_rounding() -> None:
    cfg = parse(
        RouterConfig, {"kv_cache_index": {"scoring": {"overlap_weight": 0.7, "load_weight": 0.2, "health_weight": 0.1}}}
    )
    assert cfg.kv_cache_index.scoring.overlap_weight == 0.7


def test_inline_secret_error_does_not_echo_the_value() -> None:
    problems = problems_of({"backends": [{"name": "a", "url": "http://x", "api_key": "sk-very-secret"}]})
    assert not any("sk-very-secret" in p for p in problems)


def test_redis_backend_needs_a_connection() -> None:
    problems = problems_of({"response_cache": {"enabled": True, "backend": "redis"}})
    assert problems == [
        "response_cache.backend: is redis but no connection is configured (set redis.url or response_cache.redis.url)"
    ]
    cfg = parse(
        RouterConfig, {"response_cache": {"enabled": True, "backend": "redis", "redis": {"url": "rediss://cache:6380"}}}
    )
    assert cfg.redis_connection() is cfg.response_cache.redis


def test_semantic_backend_must_exist_and_be_enabled() -> None:
    base = {"response_cache": {"semantic": {"enabled": True, "backend": "emb", "embedding_model": "m"}}}
    assert problems_of(base) == ["response_cache.semantic.backend: 'emb' is not a configured backend"]
    disabled = {**base, "backends": [{"name": "emb", "url": "http://e", "enabled": False}]}
    assert "disabled" in problems_of(disabled)[0]
    internal = {**base, "backends": [{"name": "emb", "url": "http://e", "internal": True}]}
    assert parse(RouterConfig, internal).backends[0].internal


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5m", 300), ("30m", 1800), ("10m", 600), ("1h30m", 5400), ("500ms", 0.5), ("45", 45), (90, 90), ("2d", 172800)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_duration_format_round_trips() -> None:
    for seconds in (0.25, 1, 59, 60, 300, 5400, 86400, 90061):
        assert parse_duration(format_duration(seconds)) == seconds
    assert format_duration(300) == "5m"


@pytest.mark.parametrize("bad", ["", "5 m", "m5", "-5s", True, "1y", None])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_seed_warnings() -> None:
    one = {"backends": [{"name": "b", "url": "http://127.0.0.1:8000", "models": ["m"]}]}
    cfg = parse(RouterConfig, {**one, "selection_strategy": "PrefixAwareHash"})
    assert [w.split(":")[0] for w in router_warnings(cfg)] == ["selection_strategy"]
    seed = {"model": "seed", "gpu_tier_weight": 0.2}
    cfg = parse(
        RouterConfig,
        {**one, "prefix_routing": {"enabled": True}, "kv_cache_index": {"enabled": True, "scoring": seed}},
    )
    assert [w.split(":")[0] for w in router_warnings(cfg)] == ["kv_cache_index.scoring.gpu_tier_weight"]
    # The tier weights belong to the seed formula: the cost model does not use them.
    cost = {"gpu_tier_weight": 0.2}
    cfg = parse(
        RouterConfig,
        {**one, "prefix_routing": {"enabled": True}, "kv_cache_index": {"enabled": True, "scoring": cost}},
    )
    assert router_warnings(cfg) == []
    # Only when both prefix routing and the index are on.
    cfg = parse(
        RouterConfig,
        {**one, "prefix_routing": {"enabled": True}, "kv_cache_index": {"scoring": {"gpu_tier_weight": 0.2}}},
    )
    assert router_warnings(cfg) == []
    # No backend for clients (none, all disabled, or only internal ones).
    internal = {"backends": [{**one["backends"][0], "internal": True}]}
    assert [w.split(":")[0] for w in router_warnings(parse(RouterConfig, internal))] == ["backends"]


def test_match_groups() -> None:
    backends = [
        {"name": "v1", "url": "http://10.0.0.1:8000", "type": "vllm", "models": ["llama"]},
        {"name": "v2", "url": "http://10.0.0.2:8000", "type": "vllm", "models": ["llama"]},
        {"name": "a1", "url": "https://api.anthropic.com", "type": "anthropic", "models": ["claude"]},
    ]
    group = {"name": "llama", "models": ["llama"], "mode": "precise", "hash_seed": "0"}
    cfg = parse(RouterConfig, {"backends": backends, "kv_cache_index": {"enabled": True, "groups": [group]}})
    assert cfg.match_group_of("v2") is cfg.kv_cache_index.groups[0]
    assert cfg.match_group_of("a1") is None  # the default mode applies
    assert cfg.kv_cache_index.scoring.model == "cost" and cfg.kv_cache_index.default_mode == "approximate"
    assert parse(RouterConfig, {"kv_cache_index": {"scoring": "seed"}}).kv_cache_index.scoring.model == "seed"
    # every member must exist, a backend belongs to one group, vLLM precise needs the seed
    bad = [
        {**group, "backends": ["nope"]},
        {"name": "other", "backends": ["v1"], "mode": "approximate"},
    ]
    with pytest.raises(ConfigError) as err:
        parse(RouterConfig, {"backends": backends, "kv_cache_index": {"groups": bad}})
    text = str(err.value)
    assert "kv_cache_index.groups.0.backends" in text and "already in group 'llama'" in text
    with pytest.raises(ConfigError, match="default_mode"):
        parse(RouterConfig, {"kv_cache_index": {"default_mode": "precise"}})
    with pytest.raises(ConfigError, match="hash_seed"):
        parse(RouterConfig, {"kv_cache_index": {"groups": [{"name": "g", "models": ["x"], "mode": "precise"}]}})
    # warnings: a precise group over a hosted API, a group with no member
    odd = [{"name": "c", "backends": ["a1"], "mode": "precise", "hash_seed": "0"}, {"name": "e", "models": ["none"]}]
    cfg = parse(RouterConfig, {"backends": backends, "kv_cache_index": {"enabled": True, "groups": odd}})
    assert [w.split(":")[0] for w in router_warnings(cfg)] == [
        "kv_cache_index.enabled",  # prefix routing is off in this file
        "kv_cache_index.groups.0.mode",
        "kv_cache_index.groups.1",
    ]


def test_listener_config_rules() -> None:
    ok = {"sources": [{"backend_name": "v1", "engine": "vllm", "zmq_endpoint": "tcp://127.0.0.1:5557"}]}
    assert parse(ListenerConfig, ok).limits.max_chain_tokens == 16384
    bad = {
        "listen": "nowhere",
        "sources": [
            {"backend_name": "t", "engine": "trtllm", "trtllm_endpoint": "http://10.0.0.1:8000/kv_cache_events"},
            {"backend_name": "v", "engine": "vllm", "zmq_endpoint": "tcp://*:5557", "zmq_mode": "bind"},
            {"backend_name": "s", "engine": "sglang"},
        ],
    }
    problems = problems_of(bad, ListenerConfig)
    assert "sources[0].allowed_publishers: must list the trtllm_endpoint host '10.0.0.1'" in problems
    assert "sources[1].allowed_publishers: required when zmq_mode is bind" in problems
    assert "sources[2].zmq_endpoint: required for engine sglang" in problems
    alias = parse(ListenerConfig, {"event_bus": {"url": "nats://n:4222", "embedded": False}})
    assert alias.bus is not None and alias.bus.url == "nats://n:4222"


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_validate(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["config", "validate", str(path)]) == 0
    assert "OK" in capsys.readouterr().out


def test_cli_reports_errors_with_paths_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kv_cache_index:\n  scoring:\n    overlap_weight: 0.9\n")
    assert cli_main(["config", "validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "kv_cache_index.scoring.overlap_weight: overlap_weight + load_weight + health_weight" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("a: [1,\n", "YAML syntax error at line 2"),
        ("- 1\n- 2\n", "top level must be a mapping"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_cli_unreadable_yaml_is_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes, needle: str
) -> None:
    path = tmp_path / "c.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    assert cli_main(["config", "validate", str(path)]) == 1
    assert needle in capsys.readouterr().err


def test_cli_prints_warnings_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("selection_strategy: PrefixAwareHash\n")
    assert cli_main(["config", "validate", str(path)]) == 0
    assert f"warning: {path}: selection_strategy: PrefixAwareHash" in capsys.readouterr().err


def test_cli_validates_several_files_and_fails_when_one_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))
    assert cli_main(["config", "validate", *examples]) == 0
    assert f"{len(examples)} of {len(examples)} file(s) valid" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("server:\n  port: -1\n")
    assert cli_main(["config", "validate", examples[0], str(bad)]) == 1
    captured = capsys.readouterr()
    assert f"{examples[0]}: OK" in captured.out and "1 of 2 file(s) valid" in captured.out
    assert "server.port" in captured.err


def test_cli_warns_about_a_config_with_no_backends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert cli_main(["config", "validate", str(path)]) == 0
    assert "backends: no enabled backend takes client traffic" in capsys.readouterr().err


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_router_config(path) == RouterConfig()
