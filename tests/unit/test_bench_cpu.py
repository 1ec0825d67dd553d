"""CPU accounting of `bench compare` runs (bench/continuum_bench/fleet/cpu.py), on real /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from continuum_bench.fleet.cpu import cpu_used, descendants, parse_stat, take_snapshot

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

BURN = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\ntime.sleep(30)"


def test_parse_stat_counts_fields_after_the_command_name() -> None:
    # A command name with spaces and parentheses must not shift the fields.
    fields = ["S", "41"] + ["0"] * 9 + ["250", "150"] + ["0"] * 6 + ["98765"]
    ppid, start, seconds, name = parse_stat("1234 (a (b) c) " + " ".join(fields))
    assert (ppid, start, name) == (41, 98765, "a (b) c")
    assert seconds == pytest.approx(400 / os.sysconf("SC_CLK_TCK"))


def test_descendants_walks_the_whole_tree() -> None:
    tree = {2: 1, 3: 2, 4: 3, 5: 1, 6: 99}
    assert descendants(tree, 1) == {2, 3, 4, 5}
    assert descendants(tree, 3) == {4}
    assert descendants(tree, 6) == set()


def test_cpu_is_split_between_the_engines_and_the_rest() -> None:
    before = take_snapshot(os.getpid())
    router = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=0.4)])
    engine = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=0.2)])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            after = take_snapshot(os.getpid())
            used = cpu_used(before, after, [engine.pid])
            if used.router_s >= 0.4 and used.engines_s >= 0.2:
                break
            time.sleep(0.05)
        assert 0.4 <= used.router_s < 1.5
        assert sum(used.router_by_name.values()) == pytest.approx(used.router_s)
        assert max(used.router_by_name, key=lambda name: used.router_by_name[name]).startswith("python")
        assert 0.2 <= used.engines_s < 1.0
        # The same processes seen twice: only the time between the snapshots counts.
        assert cpu_used(after, take_snapshot(os.getpid()), [engine.pid]).router_s < 0.2
    finally:
        for proc in (router, engine):
            proc.kill()
            proc.wait()
