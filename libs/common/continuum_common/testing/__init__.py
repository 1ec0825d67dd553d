"""Test harness: pytest fixtures that start real nats-server and redis-server processes.

Enable in a conftest with `pytest_plugins = ["continuum_common.testing.fixtures"]`.
"""
