"""Errors of local tokenization. Callers (the ingress's precise matching, the simulator) catch
`TokenizationError` and fall back; messages never carry prompt text or token ids."""

from __future__ import annotations

from continuum_common.errors import ContinuumError


class TokenizationError(ContinuumError):
    """A request could not be turned into token ids (or block hashes) locally."""


class TokenizerLoadError(TokenizationError):
    """A tokenizer.json or chat template file is missing, unreadable or invalid."""


class ChatTemplateError(TokenizationError):
    """The chat template failed to render (its own `raise_exception`, a sandbox violation, an
    error inside the template) or the messages are not renderable."""
