"""The NATS permissions a KV listener needs, and nothing more (DESIGN.md §5, "push mode").

A listener publishes the events of its own backends on `continuum.kv.events.<backend>` and
their heartbeats under `$KV.continuum_listeners.<backend>`, makes the few JetStream API calls it
uses (look up, and if missing create, stream CONTINUUM_KV and the heartbeat bucket), reads
its replies and the resync requests for its own backends. Given to the listener's NATS user, these permissions mean a listener - or anyone
holding its credentials - cannot announce a backend it does not own, nor read the event stream.

`continuum-kv-listener --config FILE --print-nats-user NAME` prints the nats.conf user entry for
the sources in FILE (docs/listener.md, "NATS permissions"). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from continuum_common.config.listener import ListenerConfig
from continuum_common.events import LISTENERS_BUCKET, STREAM_NAME, subject_for
from continuum_common.wire.resync import subject_for as resync_subject

DEFAULT_INBOX_PREFIX = "_INBOX"
_VAR_RE = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True, slots=True)
class ListenerPermissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def listener_permissions(
    backends: Sequence[str], *, inbox_prefix: str | None = None, may_create: bool = True
) -> ListenerPermissions:
    """Publish/subscribe allow-lists for a listener announcing `backends`. `may_create: False`
    leaves out the stream and bucket creation calls (for operators who create both first)."""
    if not backends:
        raise ValueError("a listener with no sources needs no NATS user")
    js_api = [f"$JS.API.STREAM.INFO.{STREAM_NAME}", f"$JS.API.STREAM.INFO.KV_{LISTENERS_BUCKET}"]
    if may_create:
        js_api += [f"$JS.API.STREAM.CREATE.{STREAM_NAME}", f"$JS.API.STREAM.CREATE.KV_{LISTENERS_BUCKET}"]
    publish = (
        *(subject_for(b) for b in backends),
        *(f"$KV.{LISTENERS_BUCKET}.{b}" for b in backends),
        *js_api,
    )
    # Its own replies, and resync requests for its own backends (continuum_common.wire.resync).
    subscribe = (f"{inbox_prefix or DEFAULT_INBOX_PREFIX}.>", *(resync_subject(b) for b in backends))
    return ListenerPermissions(publish, subscribe)


def password_variable(user: str) -> str:
    """The environment variable nats-server reads the user's password from, by default."""
    return "NATS_PASSWORD_" + _VAR_RE.sub("_", user).upper()


def _quoted(items: Sequence[str], indent: str) -> str:
    return ",\n".join(f'{indent}"{item}"' for item in items)


def nats_user_entry(cfg: ListenerConfig, user: str, *, password_var: str | None = None, may_create: bool = True) -> str:
    """One entry of nats.conf's `authorization { users = [ ... ] }` for the listener `cfg`;
    the password is a reference to an environment variable of the nats-server process."""
    if not re.fullmatch(r"[A-Za-z0-9_.@-]{1,128}", user):
        raise ValueError(f"{user!r} is not a usable NATS user name")
    backends = [s.backend_name for s in cfg.sources]
    inbox = cfg.bus.inbox_prefix if cfg.bus is not None else None
    perms = listener_permissions(backends, inbox_prefix=inbox, may_create=may_create)
    variable = password_var or password_variable(user)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable):
        raise ValueError(f"{variable!r} is not an environment variable name")
    return (
        f"# KV listener {user}: publishes the events and heartbeats of {', '.join(backends)} only.\n"
        "{\n"
        f'  user: "{user}"\n'
        f"  password: ${variable}\n"
        "  permissions: {\n"
        "    publish: { allow: [\n"
        f"{_quoted(perms.publish, '      ')}\n"
        "    ] }\n"
        "    subscribe: { allow: [\n"
        f"{_quoted(perms.subscribe, '      ')}\n"
        "    ] }\n"
        "  }\n"
        "}\n"
    )
