"""`serve` and `up` that cannot start: one line on stderr, exit 1, nothing logged as ready and
nothing left running."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from continuum_testing.up_process import ROUTER, run_to_end


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process listens on (SO_REUSEADDR, as servers set it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "router.yaml"
    backend = {"name": "a", "url": "http://127.0.0.1:9", "type": "openai", "models": ["m"]}
    path.write_text(yaml.safe_dump({"backends": [backend]}))
    return path


@pytest.mark.parametrize("command", ["serve", "up"])
async def test_a_port_in_use_is_one_line_and_exit_1(command: str, tmp_path: Path, taken_port: int) -> None:
    # INFO: a "ready" or "listening" line before the bind failed would show.
    code, out, err = await run_to_end(
        *ROUTER, command, "--config", str(_config(tmp_path)), "--port", str(taken_port), cwd=tmp_path, level="INFO"
    )
    assert (code, out) == (1, "")
    assert err.splitlines() == [f"error: cannot listen on 127.0.0.1:{taken_port}: address already in use"]
    # `up` takes its port before it starts nats-server: it did not start one.
    assert not (tmp_path / ".continuum" / "nats").exists()
    assert not (tmp_path / ".continuum" / "up.lock").exists()


@pytest.mark.parametrize(("command", "problem"), [("serve", "missing"), ("up", "a directory")])
async def test_an_unreadable_config_is_one_line_and_exit_1(command: str, problem: str, tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    if problem == "a directory":
        path.mkdir()
    code, out, err = await run_to_end(*ROUTER, command, "--config", str(path), "--port", "0", cwd=tmp_path)
    reason = "No such file or directory" if problem == "missing" else "Is a directory"
    assert (code, out) == (1, "")
    assert err.splitlines() == [f"error: cannot read {path}: {reason}"]
    assert not (tmp_path / ".continuum").exists()
