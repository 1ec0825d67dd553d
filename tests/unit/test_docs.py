"""The documents speak to users: every relative link resolves inside the repository, and no
document or command help cites issue numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from continuum_router.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "deploy").rglob("*.md"),
        *(ROOT / "bench").rglob("*.md"),
    ]
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
ISSUE = re.compile(r"\bissues? #?\d+\b|(?<![\w/&])#\d{1,4}\b", re.IGNORECASE)


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    return [
        target
        for target in LINK.findall(text)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")
    ]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    broken = [t for t in relative_links(path) if not (path.parent / t.split("#", 1)[0]).exists()]
    assert broken == []


def test_the_link_check_finds_relative_links_only(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    (tmp_path / "there.md").write_text("x")
    doc.write_text(
        "[ok](there.md#part) [gone](missing.md) [web](https://example.com/x) [anchor](#top)\n"
        "```\n[code](not-a-link.md)\n```\n"
    )
    assert relative_links(doc) == ["there.md#part", "missing.md"]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers(path: Path) -> None:
    assert ISSUE.findall(path.read_text(encoding="utf-8")) == []


def test_command_help_has_no_issue_numbers_and_an_example_per_command() -> None:
    parser = build_parser()
    texts = [parser.format_help()]
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for name, sub in action.choices.items():
            texts.append(sub.format_help())
            for inner in getattr(sub, "_subparsers", None)._group_actions if sub._subparsers else []:  # type: ignore[union-attr]
                texts.extend(s.format_help() for s in inner.choices.values())
            assert "example" in sub.format_help().lower(), name
    assert not any(ISSUE.search(t) for t in texts)
