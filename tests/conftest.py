"""Every integration test starts its own real servers through these fixtures.

Hypothesis runs without its per-example deadline (200 ms) and without the too-slow health
check: on a loaded two-core CI machine an example may take longer than that, and a test must
fail for what it checks, never for the machine's speed. The fuzz suite keeps its own profile
(tests/fuzz/conftest.py)."""

from hypothesis import HealthCheck, settings

pytest_plugins = ["continuum_testing.fixtures"]

settings.register_profile("continuum", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("continuum")
