"""Turn one JetStream message (subject + payload) into a KvEvent, or say why it is dropped."""

from __future__ import annotations

from continuum_common.events import SUBJECT_PREFIX, EventDecodeError, KvEvent, decode_event
from continuum_indexer.errors import DroppedEvent


def subject_backend(subject: str) -> str | None:
    if not subject.startswith(SUBJECT_PREFIX):
        return None
    return subject[len(SUBJECT_PREFIX) :] or None


def decode_bus_message(subject: str, payload: bytes) -> KvEvent:
    """The event in `payload`; DroppedEvent when it cannot be decoded or names another backend
    than its subject (listener credentials may publish only their own backends' subjects, so
    the subject is the authority)."""
    backend = subject_backend(subject)
    try:
        event = decode_event(payload)
    except EventDecodeError as exc:
        raise DroppedEvent("decode", str(exc), backend) from None
    if event.backend != backend:
        raise DroppedEvent("backend_mismatch", "payload backend differs from the subject", backend)
    return event
