"""The README and the docs/ pages: every relative link and anchor resolves, the README stays short,
and docs/index.md lists every page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README_MAX_LINES = 90  # the quick start, then links into docs/

FENCE = re.compile(r"^(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); the target ends at whitespace or ')' (an optional "title" follows).
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")


def pages() -> list[Path]:
    return [REPO / "README.md", REPO / "docker" / "README.md", *sorted(DOCS.glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    out, fence = [], ""
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line.lstrip())
        if m:
            if not fence:
                fence = m.group(1)[0] * len(m.group(1))
            elif line.lstrip().startswith(fence):
                fence = ""
            continue
        if not fence:
            out.append((number, line))
    return out


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lowercase, punctuation but '-' and '_' dropped,
    each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file's headings, with GitHub's -1, -2 ... for repeated ones."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = github_anchor(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """The link targets of a page's prose (not of code blocks or inline code), with their line."""
    out = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            out.append((number, target))
    return out


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        if re.match(r"^(https?:|mailto:)", target, re.IGNORECASE):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(REPO)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    return problems


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert page.exists(), page
    assert not broken_links(page)


def test_readme_stays_short() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_docs_index_links_every_page() -> None:
    index = DOCS / "index.md"
    linked = {(index.parent / target.partition("#")[0]).resolve() for _, target in links(index)}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p != index and p.resolve() not in linked]
    assert not missing, f"docs/index.md does not link: {missing}"


def test_readme_links_every_docs_page() -> None:
    readme = REPO / "README.md"
    linked = {(readme.parent / target.partition("#")[0]).resolve() for _, target in links(readme)}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "index.md" and p.resolve() not in linked]
    assert not missing, f"README.md's table of contents does not link: {missing}"


def test_anchor_rules_match_github() -> None:
    assert github_anchor("On a GPU server: containers") == "on-a-gpu-server-containers"
    assert github_anchor("`--json`") == "--json"
    assert github_anchor("hardware.md") == "hardwaremd"
    assert github_anchor("Where results live, and publishing them") == "where-results-live-and-publishing-them"
    assert github_anchor("Run some points") == "run-some-points"


def test_a_broken_link_or_anchor_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "other.md").write_text("# Title\n\n## A section, here\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md) [ok](other.md#a-section-here) [ok](#page) [web](https://example.com/x#y)\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [bad here](#nowhere)\n"
        "`[in code](missing-too.md)`\n\n"
        "```\n[in a block](missing-three.md)\n```\n",
        encoding="utf-8",
    )
    problems = broken_links(page)
    assert len(problems) == 3, problems
    assert "missing.md: no such file" in problems[0]
    assert "#nope" in problems[1] and "#nowhere" in problems[2]
