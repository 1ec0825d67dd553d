"""Test support for Continuum: fixtures that start real nats-server / redis-server / prometheus
processes, real-socket stand-ins for engines and upstreams, fakes of the paid provider APIs, and
harnesses that run the services in-process or as processes. Not part of any product package.

Enable the fixtures in a conftest with `pytest_plugins = ["continuum_testing.fixtures"]`.
"""
