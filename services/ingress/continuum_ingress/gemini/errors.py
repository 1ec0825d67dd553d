"""Errors of the ingress's Gemini support."""

from __future__ import annotations

from continuum_ingress.errors import IngressError, InvalidRequest


class GeminiIngressError(IngressError):
    """Base of the Gemini errors raised on purpose."""


class ConversionError(InvalidRequest, GeminiIngressError):
    """An OpenAI chat request that the native Gemini API cannot express: a 400 naming the
    parameter (it never reaches Google)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param, code="unsupported_parameter" if param else None)
