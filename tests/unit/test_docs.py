"""The documents speak to users and operators: every relative link and every mentioned `.md` file
resolves inside the repository, no document cites design notes outside it or an issue, none
narrates the history of its writing, and no command help cites issue numbers."""

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
MENTIONED_DOC = re.compile(r"[\w./-]+\.md\b")
# What a reader outside the project cannot follow: design notes and reference folders that are
# not in the repository, "the issue" a change was made for, internal tier numbers, "the seed"
# (the original specification: say what the behaviour is instead), and history: "this session",
# "a later session's machine". "session" alone stays allowed: a process runs in a session
# (setsid), a user's requests carry a session key.
OUTSIDE_OR_HISTORY = re.compile(
    r"DESIGN\.md|shared/reference"
    r"|\bissue #|\bthe issue\b"
    r"|\btier [0-9g]\b"
    r"|\bthe seed\b|\bseed's\b"
    r"|\b(?:this|that|a later|the later|later|an earlier|earlier|last|previous|other|another)"
    r" sessions?\b"
    r"|\bbefore this change\b|\ban earlier run\b|\bnot done this\b",
    re.IGNORECASE,
)


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


def mentioned_documents(path: Path) -> list[str]:
    """`.md` files a document names, in links or in prose, that exist neither next to it nor
    under the repository root."""
    text = path.read_text(encoding="utf-8")
    return [
        name
        for name in MENTIONED_DOC.findall(text)
        if not (path.parent / name).exists() and not (ROOT / name.lstrip("./")).exists()
    ]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_mentioned_documents_exist(path: Path) -> None:
    assert mentioned_documents(path) == []


def test_the_mention_check_finds_missing_documents(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    (tmp_path / "there.md").write_text("x")
    doc.write_text("See there.md, README.md and `docs/testing.md`; not DESIGN.md §5 or `spec.md` §1.\n")
    assert mentioned_documents(doc) == ["DESIGN.md", "spec.md"]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_references_outside_the_repository_or_history(path: Path) -> None:
    assert OUTSIDE_OR_HISTORY.findall(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "text",
    [
        "the contract is in DESIGN.md §6",
        "formats of shared/reference/provider-apis.md",
        "Choices the issue left open",
        "see issue #12",
        "KV-aware routing (Tier 4)",
        "Gemini context cache, tier G",
        "the seed's formula",
        "as the seed does",
        "Re-run on a later session's machine",
        "Not done this session.",
        "other sessions' test suites",
        "An earlier session measured 3 ms",
        "Before this change, it failed",
        "an earlier run gave 5 ms",
    ],
)
def test_the_outside_and_history_check_flags(text: str) -> None:
    assert OUTSIDE_OR_HISTORY.search(text), text


@pytest.mark.parametrize(
    "text",
    [
        "Each child runs in a session (and process group) of its own",
        "a hang-up detaches it from every process of the session",
        "workers run in sessions of their own",
        "over the session key: `X-Session-ID` header",
        "sessions that return with a longer context",
        "`scoring.model: seed` (or `scoring: seed`)",
        "the same seed and size give byte-identical files",
        "random seed 1",
        "the ingress did not issue for this backend",
        "tier `gpu_hot`",
    ],
)
def test_the_outside_and_history_check_allows(text: str) -> None:
    assert not OUTSIDE_OR_HISTORY.search(text), text


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers(path: Path) -> None:
    assert ISSUE.findall(path.read_text(encoding="utf-8")) == []


def test_command_help_has_no_issue_numbers_and_an_example_per_command() -> None:
    parser = build_parser()
    texts = [parser.format_help()]
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for name, sub in action.choices.items():  # type: ignore[union-attr]
            texts.append(sub.format_help())
            for inner in getattr(sub, "_subparsers", None)._group_actions if sub._subparsers else []:  # type: ignore[union-attr]
                texts.extend(s.format_help() for s in inner.choices.values())
            assert "example" in sub.format_help().lower(), name
    assert not any(ISSUE.search(t) for t in texts)
