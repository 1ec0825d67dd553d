"""The listener's NATS permission lists (pure) and the `bus.inbox_prefix` field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from continuum_common.config.listener import ListenerConfig
from continuum_common.config.router import Bus
from continuum_listener.nats_permissions import listener_permissions, nats_user_entry, password_variable


def test_permissions_name_only_the_listeners_backends() -> None:
    perms = listener_permissions(["a1", "a2"], inbox_prefix="_INBOX_a")
    assert [p for p in perms.publish if p.startswith("continuum.kv.events.")] == [
        "continuum.kv.events.a1",
        "continuum.kv.events.a2",
    ]
    assert [p for p in perms.publish if p.startswith("$KV.")] == [
        "$KV.continuum_listeners.a1",
        "$KV.continuum_listeners.a2",
    ]
    assert not any(">" in p or "*" in p for p in perms.publish)  # no wildcard grant at all
    # its replies, and the resync requests of its own backends only
    assert perms.subscribe == ("_INBOX_a.>", "continuum.kv.resync.a1", "continuum.kv.resync.a2")
    assert "$JS.API.STREAM.CREATE.CONTINUUM_KV" in perms.publish
    assert not any("CREATE" in p for p in listener_permissions(["a1"], may_create=False).publish)
    assert listener_permissions(["a1"]).subscribe == ("_INBOX.>", "continuum.kv.resync.a1")
    with pytest.raises(ValueError, match="no sources"):
        listener_permissions([])


def test_user_entry_refers_to_a_password_variable() -> None:
    cfg = ListenerConfig.model_validate(
        {"sources": [{"backend_name": "gpu-1", "engine": "vllm", "zmq_endpoint": "tcp://127.0.0.1:5557"}]}
    )
    entry = nats_user_entry(cfg, "kv-listener-a")
    assert "password: $NATS_PASSWORD_KV_LISTENER_A\n" in entry and '"continuum.kv.events.gpu-1"' in entry
    assert password_variable("edge.gpu-7") == "NATS_PASSWORD_EDGE_GPU_7"
    with pytest.raises(ValueError, match="user name"):
        nats_user_entry(cfg, 'a" }')
    with pytest.raises(ValueError, match="environment variable"):
        nats_user_entry(cfg, "a", password_var="1BAD")


@pytest.mark.parametrize("prefix", ["_INBOX.>", "a b", "x.*", "", "a..b"])
def test_inbox_prefix_must_be_a_plain_subject(prefix: str) -> None:
    with pytest.raises(ValidationError):
        Bus(inbox_prefix=prefix)


def test_inbox_prefix_accepts_subject_tokens() -> None:
    assert Bus(inbox_prefix="_INBOX_kv-listener-a").inbox_prefix == "_INBOX_kv-listener-a"
