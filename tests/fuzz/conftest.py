"""Fuzz suite settings: one hypothesis profile, reproducible in CI.

`continuum-fuzz` is derandomized (the same examples on every run, no example database), has no
per-example deadline (a loaded CI machine must not fail a test for being slow) and a bounded
number of examples per test so the whole directory stays around a minute on two cores. Tests
pick it up through `tests.fuzz.strategies.fuzz_settings`, not `load_profile`, so the unit
suite's own hypothesis tests keep their settings when both run in one session.

`CONTINUUM_FUZZ_SCALE=10 pytest tests/fuzz` runs ten times as many examples, randomized, for a
longer hunt on a developer machine (a failure prints the `@reproduce_failure` blob to keep).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from continuum_testing.leak_guard import _collect_leaked_clients

__all__ = ["_collect_leaked_clients"]

_SCALE = max(1, int(os.environ.get("CONTINUUM_FUZZ_SCALE", "1")))

settings.register_profile(
    "continuum-fuzz",
    max_examples=100 * _SCALE,
    deadline=None,
    derandomize=_SCALE == 1,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
