"""Root of the error hierarchy. Every package derives its own errors from ContinuumError so
callers can catch "anything Continuum raised on purpose" without catching programming bugs."""

from __future__ import annotations


class ContinuumError(Exception):
    """Base class of every error Continuum raises deliberately."""


class ConfigError(ContinuumError):
    """A configuration file could not be read or did not validate.

    `problems` holds one human-readable line per problem, each starting with the dotted path
    of the offending field (for example ``kv_cache_index.scoring.overlap_weight``)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems: list[str] = problems or []

    def __str__(self) -> str:
        if not self.problems:
            return super().__str__()
        return super().__str__() + "\n" + "\n".join(f"  - {p}" for p in self.problems)


class SecretError(ConfigError):
    """A secret named in the configuration (env var or file) could not be read."""


class HarnessError(ContinuumError):
    """A test-harness server (nats-server, redis-server) failed to start."""


class ListenError(ContinuumError, OSError):
    """A server could not bind its listening socket (address in use, no permission...).

    The message is one line for an operator: `cannot listen on HOST:PORT: REASON`. An OSError
    too, so callers that handle a failed bind as an OSError keep doing so."""
