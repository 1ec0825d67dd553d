"""The start-up benchmark's pieces: its router configuration is one `serve` accepts (a KV
precise group on an external bus, with or without a local tokenizer), and bytecode is written
for a checkout's sources as an installed package has it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from continuum_bench.bytecode import compile_tree
from continuum_bench.startup import config
from continuum_common.config import load_router_config


@pytest.mark.parametrize("tokenizer", [None, (Path("/models/tokenizer.json"), Path("/models/template.jinja"))])
def test_the_benchmarked_router_configuration_is_valid(tmp_path: Path, tokenizer: tuple[Path, Path] | None) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(config("nats://127.0.0.1:4222", tokenizer)))
    cfg = load_router_config(path)
    (group,) = cfg.kv_cache_index.groups
    assert group.mode == "precise" and len(cfg.backends) == 4
    assert cfg.bus.embedded is False
    assert (group.tokenizer is None) is (tokenizer is None)


def test_compile_tree_writes_the_bytecode_of_a_checkout(tmp_path: Path) -> None:
    source = tmp_path / "libs" / "pkg" / "mod.py"
    source.parent.mkdir(parents=True)
    source.write_text("X = 1\n")
    compile_tree(tmp_path)
    assert Path(importlib.util.cache_from_source(str(source))).is_file()
