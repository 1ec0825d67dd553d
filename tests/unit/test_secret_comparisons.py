"""Secrets are compared in constant time.

The admin token is the one secret a client presents to Continuum (`Authorization: Bearer` on
`/admin/*`; the indexer and gemini-cache have no HTTP admin surface, their admin subjects are
guarded by NATS permissions). `token_matches` must compare with `hmac.compare_digest` against
every configured token, without stopping at the first match; and no module compares a
secret-looking value with `==` / `!=`."""

from __future__ import annotations

import ast
import hmac
from pathlib import Path

import pytest

from continuum_ingress import admin

ROOT = Path(__file__).resolve().parents[2]
SECRET_WORDS = ("admin_token", "bearer", "secret", "password", "api_key", "presented")


def test_every_configured_token_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr(admin.hmac, "compare_digest", counting)
    tokens = (b"first-token", b"second-token", b"third-token")
    assert admin.token_matches(b"first-token", tokens)
    assert len(calls) == 3  # a match on the first token does not end the loop early
    calls.clear()
    assert not admin.token_matches(b"first-tokeN", tokens)
    assert len(calls) == 3
    assert not admin.token_matches(b"", tokens)


def _names(node: ast.AST) -> list[str]:
    found: list[str] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.append(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.append(sub.attr)
    return found


def _secret_comparisons(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or not any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
            continue
        operands = [node.left, *node.comparators]
        # `x is None`-style checks and comparisons with literals (a scheme name, say) leak nothing.
        if any(isinstance(o, ast.Constant) for o in operands):
            continue
        names = [n.lower() for o in operands for n in _names(o)]
        if any(word in n for n in names for word in SECRET_WORDS):
            out.append(f"{path.relative_to(root)}:{node.lineno}")
    return out


def _product_sources() -> list[Path]:
    """Product modules; the fakes under `testing/` stand in for external APIs in tests."""
    paths = [*ROOT.joinpath("services").rglob("*.py"), *ROOT.joinpath("libs").rglob("*.py")]
    return [p for p in paths if "testing" not in p.relative_to(ROOT).parts and p.name != "testing.py"]


def test_no_secret_is_compared_with_equality_operators() -> None:
    sources = _product_sources()
    assert sources
    found = [hit for path in sources for hit in _secret_comparisons(path)]
    assert found == []


def test_the_scan_finds_an_equality_check(tmp_path: Path) -> None:
    module = tmp_path / "auth.py"
    module.write_text(
        "def ok(presented, cfg):\n"
        "    if cfg.scheme == 'bearer':\n"  # a literal: fine
        "        return presented == cfg.admin_token\n"
    )
    assert _secret_comparisons(module, tmp_path) == ["auth.py:3"]
