"""gemini-cache pure decisions and configuration resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from continuum_common.config.router import RouterConfig
from continuum_common.errors import SecretError
from continuum_common.gemini_api import parse_error
from continuum_common.wire.gemini import EnsureRequest
from continuum_gemini_cache.config import resolve
from continuum_gemini_cache.errors import DisabledError
from continuum_gemini_cache.model import Entry
from continuum_gemini_cache.policy import classify_create_failure, ineligible_reason, should_extend


def _cfg(**cache: object) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "gemini_context_cache": {"enabled": True, "min_prefix_bytes": 1024, **cache},
            "backends": [
                {"name": "gem-a", "url": "https://generativelanguage.googleapis.com/v1beta/openai", "type": "gemini"},
                {"name": "vllm-a", "url": "http://127.0.0.1:9", "type": "vllm"},
            ],
        }
    )


def test_disabled_refuses_with_a_clear_message() -> None:
    cfg = RouterConfig.model_validate({"gemini_context_cache": {"enabled": False}})
    with pytest.raises(DisabledError) as info:
        resolve(cfg, source="router.yaml")
    text = str(info.value)
    assert "gemini_context_cache.enabled is false in router.yaml" in text and "refuses to start" in text


def test_only_gemini_backends_with_keys_from_env_or_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("file-key\n")
    monkeypatch.setenv("GEM_B_KEY", "env-key")
    cfg = RouterConfig.model_validate(
        {
            "gemini_context_cache": {"enabled": True},
            "backends": [
                {"name": "gem-a", "url": "http://127.0.0.1:1/v1beta", "type": "gemini", "api_key_file": str(key_file)},
                {"name": "gem-b", "url": "http://127.0.0.1:2", "type": "gemini", "api_key_env": "GEM_B_KEY"},
                {"name": "gem-off", "url": "http://127.0.0.1:3", "type": "gemini", "enabled": False},
                {"name": "oai", "url": "http://127.0.0.1:4", "type": "openai"},
            ],
        }
    )
    settings = resolve(cfg)
    assert sorted(settings.backends) == ["gem-a", "gem-b"]
    assert (
        settings.backends["gem-a"].api_key == "file-key" and settings.backends["gem-a"].api_root == "http://127.0.0.1:1"
    )
    assert settings.backends["gem-b"].api_key == "env-key"
    assert "env-key" not in repr(settings.backends["gem-b"])
    monkeypatch.delenv("GEM_B_KEY")
    with pytest.raises(SecretError, match="GEM_B_KEY is not set"):
        resolve(cfg)


def test_eligibility() -> None:
    settings = resolve(_cfg())
    system = "x" * 1024
    assert ineligible_reason(EnsureRequest.build("gem-a", "gemini-2.5-flash", system), settings) is None
    assert "min_prefix_bytes" in (ineligible_reason(EnsureRequest.build("gem-a", "m", "x" * 1023), settings) or "")
    assert "type: gemini" in (ineligible_reason(EnsureRequest.build("vllm-a", "m", system), settings) or "")
    forged = EnsureRequest("gem-a", "m", "00" * 32, system)
    assert "digest" in (ineligible_reason(forged, settings) or "")


def _err(status: int, message: str = "", reason: str = "") -> object:
    details = [{"reason": reason}] if reason else []
    return parse_error(status, {"error": {"code": status, "message": message, "details": details}})


def test_create_failures_400_is_negative_others_are_transient() -> None:
    too_small = parse_error(400, {"error": {"message": "total_token_count=16, min_total_token_count=1024"}})
    assert classify_create_failure(400, too_small, None).negative
    assert classify_create_failure(400, too_small, None).reason == "rejected"
    bad_key = parse_error(400, {"error": {"message": "API key not valid.", "details": [{"reason": "API_KEY_INVALID"}]}})
    assert classify_create_failure(400, bad_key, None) == classify_create_failure(403, None, None)
    assert not classify_create_failure(400, bad_key, None).negative
    assert classify_create_failure(404, None, None).negative  # no cachedContents endpoint at all
    for status, reason in ((429, "rate_limited"), (500, "http_5xx"), (503, "http_5xx"), (409, "http_4xx")):
        verdict = classify_create_failure(status, None, None)
        assert verdict.reason == reason and not verdict.negative
    assert classify_create_failure(0, None, "timeout").reason == "timeout"
    assert not classify_create_failure(0, None, "timeout").negative


def test_extend_when_at_most_a_fifth_of_the_ttl_is_left() -> None:
    entry = Entry("gem-a", "ab" * 32, "m", "cachedContents/x", expire_at=1000.0, ttl_seconds=600, created_at=400.0)
    assert not should_extend(entry, 1000.0 - 121)
    assert should_extend(entry, 1000.0 - 120)
    assert should_extend(entry, 999.0)
    assert not should_extend(entry, 1000.0)  # already expired: nothing to extend
