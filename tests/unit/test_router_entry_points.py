"""The ways to start the launcher: `python -m continuum_router`, and `python -m continuum_ingress`,
which hands over to it (the ingress package imports no other service)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from continuum_router.run import _serve_argv


@pytest.mark.parametrize("module", ["continuum_router", "continuum_ingress"])
def test_python_dash_m_runs_the_continuum_router_command(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: continuum-router serve")


def test_serve_workers_run_the_launcher() -> None:
    """A supervisor's workers are `serve` of the launcher (it composes the embedded KV index)."""
    argv = _serve_argv("router.yaml", 0.5, "INFO")
    assert argv[:4] == [sys.executable, "-m", "continuum_router", "serve"]
    assert argv[4:] == ["--config", "router.yaml", "--watch-interval", "0.5", "--log-level", "INFO"]
