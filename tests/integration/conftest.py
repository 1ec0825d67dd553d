"""Fixtures for the integration suite."""

from continuum_testing.leak_guard import _collect_leaked_clients

__all__ = ["_collect_leaked_clients"]
