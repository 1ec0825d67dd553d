"""Shared building blocks of Continuum: configuration, hashing, the CHWBL ring, the event
schema, connection helpers and the real-service test harness."""

__version__ = "0.1.0"
