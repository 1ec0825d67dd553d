"""Shared helpers for the simulator's tests: the KV-event fixtures copied from the shared folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The fixtures live with the tests, in the repository (this package is used from a checkout).
FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "kv-events"
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "manifest.json").read_text())
HASH_INPUTS: dict[str, Any] = MANIFEST["hash_inputs"]["vllm"]
T1: list[int] = HASH_INPUTS["T1"]
T2: list[int] = HASH_INPUTS["T2"]
T3: list[int] = HASH_INPUTS["T3"]
FIXTURE_TS: float = MANIFEST["hash_inputs"]["ts"]
ERA_DIRS = {"array": "vllm/vllm-20260512-bcb9c13", "map": "vllm/vllm-20260717-426d48b"}


def fixture_bytes(relative: str) -> bytes:
    return (FIXTURES / relative).read_bytes()


def zmq_frames(stem: str) -> list[bytes]:
    """The frames of one ZMQ capture (`zmq/<stem>.json` lists its `.bin` frame files)."""
    meta = json.loads((FIXTURES / "zmq" / f"{stem}.json").read_text())
    return [(FIXTURES / "zmq" / name).read_bytes() for name in meta["frame_files"]]
