"""Errors the simulator raises on purpose; each HTTP-facing one knows its status and type."""

from __future__ import annotations

from continuum_common.errors import ContinuumError


class SimError(ContinuumError):
    """Base class of the simulator's errors."""


class SimConfigError(SimError):
    """An engine configuration is inconsistent (e.g. the KV cache cannot hold max_model_len)."""


class RequestError(SimError):
    """A request the engine refuses; rendered as an OpenAI/vLLM or Anthropic error body."""

    status = 400
    error_type = "BadRequestError"
    anthropic_type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(RequestError):
    """Malformed or unsupported input (400)."""


class ModelNotFound(RequestError):
    status = 404
    error_type = "NotFoundError"
    anthropic_type = "not_found_error"


class UnsupportedMediaType(RequestError):
    status = 415
    error_type = "UnsupportedMediaType"


class EngineBusy(RequestError):
    """The waiting queue is full (503, retryable)."""

    status = 503
    error_type = "ServiceUnavailableError"
    anthropic_type = "overloaded_error"


class Conflict(RequestError):
    """The operation conflicts with the engine's state (409), e.g. a cache reset while busy."""

    status = 409
    error_type = "ConflictError"
