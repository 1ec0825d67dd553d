"""The APIs the ingress serves, and what each needs from the rest of the pipeline."""

from __future__ import annotations

from enum import StrEnum

from continuum_ingress.protocol.errors import ErrorStyle


class Api(StrEnum):
    """Client-facing endpoints that forward to a backend. The value is the metrics label."""

    CHAT = "chat_completions"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"
    RESPONSES = "responses"
    MESSAGES = "anthropic_messages"

    @property
    def error_style(self) -> ErrorStyle:
        return ErrorStyle.ANTHROPIC if self is Api.MESSAGES else ErrorStyle.OPENAI


CLIENT_PATHS: dict[str, Api] = {
    "/v1/chat/completions": Api.CHAT,
    "/v1/completions": Api.COMPLETIONS,
    "/v1/embeddings": Api.EMBEDDINGS,
    "/v1/responses": Api.RESPONSES,
    "/anthropic/v1/messages": Api.MESSAGES,
    # Where vLLM, SGLang and most gateways serve Anthropic Messages: the Anthropic SDK pointed at
    # the router's root (`base_url="http://HOST:PORT"`) works as well as at `/anthropic`.
    "/v1/messages": Api.MESSAGES,
}


def path_error_style(path: str) -> ErrorStyle:
    """The error shape for a request to `path` that matched no endpoint (404, 405)."""
    if path.startswith(("/anthropic/", "/v1/messages")):
        return ErrorStyle.ANTHROPIC
    return ErrorStyle.OPENAI
