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
    error_code: str | None = None  # the OpenAI body's `code`; None: the status, as vLLM sends it
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


class ResponseNotFound(RequestError):
    """A request names a response this engine does not hold (never stored here, forgotten,
    deleted, or the store is off): 404 with OpenAI's error, the id in the message, so a router
    can tell "not on this engine" apart from a bad request. `param` is "previous_response_id"
    when the id came in that field, None when it came in the path (`/v1/responses/{id}`)."""

    status = 404
    error_type = "invalid_request_error"
    error_code = "response_not_found"
    anthropic_type = "not_found_error"

    def __init__(self, response_id: str, *, param: str | None = None) -> None:
        super().__init__(f"Response with id '{response_id}' not found.", param=param)


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
