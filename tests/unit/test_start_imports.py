"""What an ingress imports to start: nothing it is not configured to use. A restarted router is
out of its load balancer until it is ready, and most of its start is importing (redis-py alone
was a tenth of it; docs/benchmarks.md, "Start and stop")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

PROBE = """
import sys
from continuum_router.compose import build_ingress
build_ingress(sys.argv[1])
print(" ".join(sorted({m.split(".")[0] for m in sys.modules} & {"redis", "fastapi"})))
"""


def _built_imports(tmp_path: Path, config: dict[str, object]) -> set[str]:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], check=False, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def _config(**extra: object) -> dict[str, object]:
    return {
        "backends": [{"name": "b0", "url": "http://127.0.0.1:9", "type": "vllm", "models": ["m"]}],
        "prefix_routing": {"enabled": True},
        **extra,
    }


def test_an_ingress_without_redis_imports_neither_redis_nor_fastapi(tmp_path: Path) -> None:
    kv = {"enabled": True, "backend": "memory"}
    assert _built_imports(tmp_path, _config(kv_cache_index=kv)) == set()


def test_an_ingress_with_a_redis_response_cache_imports_redis(tmp_path: Path) -> None:
    cache = {"enabled": True, "backend": "redis", "redis": {"url": "redis://127.0.0.1:9"}}
    assert _built_imports(tmp_path, _config(response_cache=cache)) == {"redis"}
