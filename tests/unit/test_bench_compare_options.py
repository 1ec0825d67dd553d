"""`bench compare` / `bench fleet` option plumbing, the Continuum router configurations it
writes (validated against the committed schema), and the tokenizer codecs (pure)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HfTokenizer

from continuum_bench import compare
from continuum_bench.fleet import cli as fleet_cli
from continuum_bench.fleet.continuum import STACKS, KvStack, bus_dir, kv_index_config, listener_config
from continuum_bench.fleet.driver import RequestResult
from continuum_bench.fleet.harness import ROUTERS, FleetContext, router_urls
from continuum_bench.fleet.runner import FleetBenchOptions, build_workload, engine_configs, restart_summary, router_list
from continuum_bench.fleet.tokens import HfTokenizerFiles, Texts, make_codec, train_hf_tokenizer
from continuum_bench.fleet.trace import TRACE_BLOCK, BlockTexts
from continuum_common.config.listener import ListenerConfig
from continuum_common.config.loader import parse
from continuum_common.config.router import RouterConfig
from continuum_sim import EngineEndpoints, Tokenizer, render_chat
from continuum_sim.protocol.chat_template import ChatMessage


def engine(i: int) -> EngineEndpoints:
    return EngineEndpoints(
        name=f"sim-{i}", model="continuum-sim-8b", url=f"http://127.0.0.1:{8100 + i}",
        kv_events_endpoint=f"tcp://127.0.0.1:{5600 + 2 * i}", zmq_mode="bind",
        replay_endpoint=f"tcp://127.0.0.1:{5601 + 2 * i}", topic="", era="map", hash_wire="int",
        block_size=16, num_gpu_blocks=1500, python_hash_seed="0",
    )  # fmt: skip


def test_compare_parses_trace_tokenizer_and_engine_options() -> None:
    argv = [
        "--workloads", "trace,conversations", "--trace", "/tmp/t.jsonl", "--trace-duration", "600",
        "--trace-limit", "50", "--max-model-len", "32768", "--block-size", "32", "--tokenizer", "hf",
        "--num-gpu-blocks", "9000", "--duration", "300", "--rate", "1.5", "--count-engine-calls",
        "--restart-router-at", "45", "--trace-start", "300",
    ]  # fmt: skip
    args = compare.build_parser().parse_args(argv)
    opts = compare.options(args, argv)
    assert (opts.trace, opts.trace_duration, opts.trace_limit) == ("/tmp/t.jsonl", 600.0, 50)
    assert opts.trace_start == 300.0
    assert (opts.max_model_len, opts.block_size, opts.num_gpu_blocks, opts.tokenizer) == (32768, 32, 9000, "hf")
    assert (opts.duration, opts.rate) == (300.0, 1.5)
    assert args.count_engine_calls is True
    assert opts.restart_router_at == 45.0
    assert opts.command.startswith("continuum-router bench compare --workloads trace,conversations")


def test_compare_refuses_unknown_names_and_missing_traces(capsys: pytest.CaptureFixture[str]) -> None:
    assert compare.main(["--routers", "nope"]) == 2
    assert "unknown router(s) nope" in capsys.readouterr().err
    assert compare.main(["--workloads", "bogus"]) == 2
    assert "unknown workload(s) bogus" in capsys.readouterr().err
    assert compare.main(["--workloads", "trace", "--trace", "/nonexistent/trace.jsonl"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert compare.main(["--restart-router-at", "0"]) == 2
    assert "--restart-router-at must be > 0" in capsys.readouterr().err
    assert compare.main(["--trace-start", "-1"]) == 2
    assert "--trace-start must be >= 0" in capsys.readouterr().err


def test_compare_lists_every_registered_router(capsys: pytest.CaptureFixture[str]) -> None:
    assert compare.main(["--list"]) == 0
    listed = capsys.readouterr().out.split()
    for name in ("continuum-prefix-hash-kv", "continuum-kv-approx", "continuum-kv-precise", "continuum-kv-precise-redis",
                 "continuum-kv-precise-x3", "continuum-kv-approx-x3", "continuum-kv-approx-bare",
                 "continuum-kv-precise-bare", "direct-round-robin"):  # fmt: skip
        assert name in listed and name in ROUTERS


def test_fleet_cli_parses_the_new_options() -> None:
    argv = ["--workload", "conversations", "--duration", "120", "--tokenizer", "hf", "--trace-limit", "9"]
    args = fleet_cli.build_parser().parse_args([*argv, "--router", "http://a:1,http://b:2"])
    assert (args.workload, args.duration, args.tokenizer, args.trace_limit) == ("conversations", 120.0, "hf", 9)
    opts = FleetBenchOptions(router=args.router)
    assert router_list(opts.router) == ["http://a:1", "http://b:2"]
    assert opts.label == "a:1,b:2"


def test_router_urls_normalises_a_factory_yield() -> None:
    assert router_urls("http://x") == ["http://x"]
    assert router_urls(["http://x", "http://y"]) == ["http://x", "http://y"]
    with pytest.raises(ValueError):
        router_urls([])


def test_engine_configs_carry_the_hf_tokenizer_only_when_asked(tmp_path: Path) -> None:
    opts = FleetBenchOptions(engines=2, max_model_len=8192, num_gpu_blocks=600)
    configs = engine_configs(opts)
    assert [c.max_model_len for c in configs] == [8192, 8192]
    assert all(c.tokenizer is None and c.chat_template is None for c in configs)
    with pytest.raises(ValueError, match="trained tokenizer"):
        engine_configs(replace(opts, tokenizer="hf"))
    files = HfTokenizerFiles(tmp_path / "tokenizer.json", tmp_path / "chat_template.jinja")
    configs = engine_configs(replace(opts, tokenizer="hf", hf_tokenizer=files))
    assert {(c.tokenizer, c.chat_template) for c in configs} == {(str(files.tokenizer), str(files.chat_template))}


def test_build_workload_knows_conversations() -> None:
    texts = Texts(make_codec("builtin"))
    opts = FleetBenchOptions(workload="conversations", duration=60, rate=1.0, system_prompts=3, max_model_len=16384)
    workload = build_workload(opts, texts)
    info = workload.describe()
    assert info["workload"] == "conversations" and info["duration"] == 60 and info["max_model_len"] == 16384
    assert info["shape"]["rate"] == 1.0 and info["shape"]["system_prompts"] == 3
    with pytest.raises(ValueError, match="unknown workload"):
        build_workload(replace(opts, workload="nope"), texts)


def _ctx(tmp_path: Path, files: HfTokenizerFiles | None = None) -> FleetContext:
    return FleetContext([engine(0), engine(1)], tmp_path, FleetBenchOptions(), hf_tokenizer=files)


def _router_config(ctx: FleetContext, stack: KvStack) -> RouterConfig:
    from continuum_bench.fleet.continuum import continuum_config

    doc = continuum_config(ctx, "PrefixAwareHash", prefix_routing=True)
    doc["kv_cache_index"] = kv_index_config(ctx, stack, "/tmp/salt")
    if stack.backend == "redis":
        doc["redis"] = {"url": "redis://127.0.0.1:6390"}
    return parse(RouterConfig, doc)


@pytest.mark.parametrize(("name", "stack"), STACKS)
def test_kv_router_configs_validate_against_the_schema(name: str, stack: KvStack, tmp_path: Path) -> None:
    config = _router_config(_ctx(tmp_path), stack)
    index = config.kv_cache_index
    assert index.enabled and index.backend == stack.backend
    if stack.mode == "prefix_key":
        assert index.default_mode == "prefix_key" and index.scoring.model == "seed" and index.salt_echo.enabled
    elif stack.mode == "approximate":
        assert index.default_mode == "approximate" and not index.groups
    else:
        (group,) = index.groups
        assert (group.mode, group.engine, group.block_size, group.hash_seed) == ("precise", "vllm", 16, "0")
        assert group.models == ["continuum-sim-8b"] and group.tokenizer is None and group.chat_template is None
        assert config.match_group_of("sim-1") is group
    assert stack.replicas == (3 if name.endswith("-x3") else 1)
    bare = name.endswith("-bare")  # the single-replica features switched off, for measuring their cost
    assert (index.learn_answers, index.share_decisions) == (not bare, not bare)
    assert config.shared_load().enabled is not bare


def test_every_run_of_a_kv_stack_starts_with_its_own_bus_store(tmp_path: Path) -> None:
    ctx, stack = _ctx(tmp_path), dict(STACKS)["continuum-kv-precise"]
    ctx.run = "multi-turn"
    first = bus_dir(ctx, stack)
    ctx.run = "shared-prompt"
    assert bus_dir(ctx, stack) != first  # no route history or KV stream from the workload before
    assert bus_dir(ctx, dict(STACKS)["continuum-kv-approx"]) != bus_dir(ctx, stack)


def test_precise_group_names_the_hf_tokenizer_files(tmp_path: Path) -> None:
    files = HfTokenizerFiles(tmp_path / "tokenizer.json", tmp_path / "chat_template.jinja")
    stack = dict(STACKS)["continuum-kv-precise"]
    (group,) = _router_config(_ctx(tmp_path, files), stack).kv_cache_index.groups
    assert group.tokenizer == str(files.tokenizer) and group.chat_template == str(files.chat_template)


def test_listener_sources_publish_what_the_stack_matches(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    blocks = listener_config(ctx, dict(STACKS)["continuum-kv-precise"], "nats://127.0.0.1:4999", "/tmp/salt")
    assert [s["publish"] for s in blocks["sources"]] == ["blocks", "blocks"]
    assert blocks["bus"] == {"embedded": False, "url": "nats://127.0.0.1:4999"}
    prefix = listener_config(ctx, dict(STACKS)["continuum-prefix-hash-kv"], "nats://127.0.0.1:4999", "/tmp/salt")
    assert [(s["publish"], s["prefix_key_mode"]) for s in prefix["sources"]] == [("prefix", "auto")] * 2
    for doc in (blocks, prefix):
        parse(ListenerConfig, doc)


# -- codecs --------------------------------------------------------------------------------


def test_builtin_codec_matches_the_engine() -> None:
    codec = make_codec("builtin")
    tok = Tokenizer()
    messages = [ChatMessage("system", "You are terse."), ChatMessage("user", "Hello there, engine.")]
    assert codec.chat_ids(messages) == tok.encode(render_chat(messages))
    text = Texts(codec).text(300, random.Random(5))
    assert len(codec.encode(text)) == 300 and codec.decode(codec.encode(text)) == text


@pytest.fixture(scope="module")
def hf_files(tmp_path_factory: pytest.TempPathFactory) -> HfTokenizerFiles:
    """The simulator's small trained byte-level BPE tokenizer and its ChatML template."""
    return train_hf_tokenizer(tmp_path_factory.mktemp("hf"))


def test_hf_codec_tokenizes_like_the_engine(hf_files: HfTokenizerFiles) -> None:
    codec = make_codec("hf", hf_files)
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Why is the sky blue?")]
    rendered = codec.render(messages)
    assert rendered == render_chat(messages), "the same ChatML text as the built-in template"
    ids = codec.chat_ids(messages)
    raw = HfTokenizer.from_file(str(hf_files.tokenizer))
    assert ids == raw.encode(rendered, add_special_tokens=False).ids
    assert ids[0] == raw.token_to_id("<|im_start|>"), "special tokens in the template text are single tokens"
    assert codec.decode(ids) == rendered
    assert codec.encode("Hello there") == raw.encode("Hello there", add_special_tokens=True).ids
    assert ids != make_codec("builtin").chat_ids(messages), "a different tokenizer than the built-in one"


def test_texts_have_about_the_hf_token_count(hf_files: HfTokenizerFiles) -> None:
    texts = Texts(make_codec("hf", hf_files))
    for count in (1, 37, 512, 2000):
        text = texts.text(count, random.Random(count))
        assert abs(len(texts.codec.encode(text)) - count) <= 2
    a = texts.text(500, random.Random(9), leading_space=True)
    assert a == texts.text(500, random.Random(9), leading_space=True), "deterministic"
    assert a.startswith(" ")


def test_trace_prompts_with_the_hf_tokenizer(hf_files: HfTokenizerFiles) -> None:
    codec = make_codec("hf", hf_files)
    blocks = BlockTexts(Texts(codec))
    text_a, a = blocks.prompt([1, 2, 3], 2 * TRACE_BLOCK + 100)
    text_b, b = blocks.prompt([1, 2, 7], 3 * TRACE_BLOCK)
    assert a == codec.encode(text_a) and b == codec.encode(text_b), "the ids the engine will see"
    assert abs(len(a) - (2 * TRACE_BLOCK + 100)) <= 4 and abs(len(b) - 3 * TRACE_BLOCK) <= 4
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert 2 * TRACE_BLOCK - 4 <= shared <= 2 * TRACE_BLOCK + 4, "equal hash ids give equal leading tokens"


def test_make_codec_needs_files_for_hf() -> None:
    with pytest.raises(ValueError, match="tokenizer files"):
        make_codec("hf")
    with pytest.raises(ValueError, match="unknown tokenizer"):
        make_codec("sentencepiece")


def _result(sent_at: float, prompt: int, cached: int, ideal: int, *, ok: bool = True) -> RequestResult:
    return RequestResult(
        ok=ok, error=None if ok else "HTTP 502", engine=None, sent_at=sent_at, ttft=0.02 if ok else None,
        e2e=0.5 if ok else None, prompt_tokens=prompt, cached_tokens=cached, completion_tokens=4, ideal_hit_tokens=ideal,
    )  # fmt: skip


def test_restart_summary_splits_the_run_at_the_restart() -> None:
    results = [
        _result(1.0, 100, 90, 90),
        _result(9.0, 100, 80, 90),
        _result(10.5, 100, 40, 80),  # after the restart at 10 s, paused 0.5 s
        _result(45.0, 100, 80, 80),  # after, but beyond the first 30 s
        _result(12.0, 100, 0, 0, ok=False),
    ]
    summary = restart_summary(results, 10.0, 0.5, 0.125)
    assert (summary["at_s"], summary["downtime_s"]) == (10.0, 0.5)
    assert (summary["drain_s"], summary["restart_s"]) == (0.125, 0.375)
    assert summary["before"]["requests"] == 2 and summary["before"]["hit_rate_vs_ideal"] == pytest.approx(170 / 180)
    after = summary["after"]
    assert (after["requests"], after["errors"]) == (3, 1)
    assert after["hit_rate_vs_ideal"] == pytest.approx(120 / 160)
    assert summary["first_30s_after"]["hit_rate_vs_ideal"] == pytest.approx(40 / 80)
    # A restart after the last request: the empty phase says so instead of a zero.
    late = restart_summary(results[:2], 20.0, 1.0, 0.25)
    assert late["after"]["requests"] == 0 and late["after"]["hit_rate_vs_ideal"] is None
    row = compare.restart_table([{"workload": {"workload": "w"}, "router": "r", "restart": late}])
    assert "| w | r | 20.0 | 1.00 | 0.25 / 0.75 | 0.9444 | - | - | 0 | - |" in row
