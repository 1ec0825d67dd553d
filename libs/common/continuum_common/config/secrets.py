"""Secrets are named in the configuration, never written in it: an environment variable or a
file path. Resolution happens when a component starts, so `config validate` can check the
shape of a file on a machine that does not hold the secrets."""

from __future__ import annotations

import os
from pathlib import Path

from continuum_common.errors import SecretError


def read_secret(env: str | None, file: str | None, *, what: str) -> str | None:
    """Return the secret from `env` or `file` (stripped of a trailing newline), or None when
    neither is configured. Raise SecretError (without the value) when a named source is empty
    or unreadable."""
    if env:
        value = os.environ.get(env)
        if value is None or value == "":
            raise SecretError(f"{what}: environment variable {env} is not set")
        return value
    if file:
        try:
            value = Path(file).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise SecretError(f"{what}: cannot read secret file {file}: {exc.strerror}") from None
        if not value:
            raise SecretError(f"{what}: secret file {file} is empty")
        return value
    return None
