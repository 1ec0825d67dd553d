"""The simulated engine's timing settings as the command line gives them."""

from __future__ import annotations

import pytest

from continuum_sim.cli import build_parser, configs_from_args
from continuum_sim.policy.timing import TimingConfig


def test_tokenize_time_from_the_command_line() -> None:
    args = build_parser().parse_args(["--count", "2", "--tokenize-s", "0.25", "--time-scale", "0.5"])
    timings = [c.timing for c in configs_from_args(args)]
    assert [(t.tokenize_s, t.time_scale) for t in timings] == [(0.25, 0.5), (0.25, 0.5)]
    assert configs_from_args(build_parser().parse_args([]))[0].timing.tokenize_s == 0.0


def test_a_negative_tokenize_time_is_refused() -> None:
    with pytest.raises(ValueError, match="tokenize_s"):
        TimingConfig(tokenize_s=-0.1)
