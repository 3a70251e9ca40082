"""The docs hold together: design citations resolve, the user's pages stay a short read, cited files exist.

Every "DESIGN.md §N" in the code, the docs and the lab names a section of docs/DESIGN.md; nothing cites a
design file outside the repository. The user's pages (README.md and docs/*.md) stay under 6,000 words
together and name no issue numbers or lending-machine kinds; the figure pages (docs/RESULTS.md,
docs/BENCHMARKS.md, lab/DEVELOPMENT.md) stay within 300 lines and their commands parse; every JSON file,
results directory and link those pages name is committed. The round-by-round record in lab/record/ is
frozen and not checked beyond its design citations.
"""

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for folder in ("oscarkv", "tests", "lab", "scripts") for p in (ROOT / folder).rglob("*")
           if p.suffix in (".py", ".md", ".sh")] + [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
USER_PAGES = ("README.md", "docs/DESIGN.md", "docs/RESULTS.md", "docs/BENCHMARKS.md")
FIGURE_PAGES = ("docs/RESULTS.md", "docs/BENCHMARKS.md", "lab/DEVELOPMENT.md")
WORD_BUDGET = 6000


def design_sections() -> set[int]:
    return {int(n) for n in re.findall(r"^## (\d+)\.", (ROOT / "docs" / "DESIGN.md").read_text(), flags=re.M)}


def test_design_citations_resolve():
    sections, bad, seen = design_sections(), [], 0
    for path in SOURCES:
        for cite in re.findall(r"DESIGN\.md((?:,? §\d+)+)", path.read_text(encoding="utf-8")):
            for n in map(int, re.findall(r"§(\d+)", cite)):
                seen += 1
                if n not in sections:
                    bad.append(f"{path.relative_to(ROOT)}: §{n}")
    assert seen > 10 and not bad, bad


def test_no_design_file_outside_the_repository():
    here = Path(__file__).resolve()
    bad = [str(p.relative_to(ROOT)) for p in SOURCES if p != here and "shared/DESIGN.md" in p.read_text(encoding="utf-8")]
    assert not bad


@pytest.mark.parametrize("page", FIGURE_PAGES)
def test_figure_pages_are_short(page):
    assert len((ROOT / page).read_text().splitlines()) <= 300


def test_user_pages_are_a_short_read():
    """README and the user's docs together stay under the word budget (as ``wc -w`` counts)."""
    words = {page: len((ROOT / page).read_text().split()) for page in USER_PAGES}
    assert sum(words.values()) < WORD_BUDGET, words


@pytest.mark.parametrize("page", USER_PAGES)
def test_user_pages_name_no_issue_or_machine_kind(page):
    """The user's pages speak of devices (one H100), not of issue numbers or the lending machines' kinds."""
    text = (ROOT / page).read_text()
    bad = re.findall(r"[Ii]ssue \d+|#\d+\b|nvidia-h[12]00[-\w]*|\blent\b|device tool", text)
    assert not bad, bad


@pytest.mark.parametrize("page", sorted(set(FIGURE_PAGES + USER_PAGES)))
def test_cited_files_exist(page):
    """Backticked JSON files, ``docs/`` and ``lab/`` paths, and relative links (``*`` / ``NAME`` patterns skipped)."""
    text = (ROOT / page).read_text()
    cited = [n for n in re.findall(r"`([^`\s]+\.json)`", text) if "/" in n]
    cited += [p.rstrip("/.,") for p in re.findall(r"`((?:docs|lab)/[^`\s]+)`", text)]
    cited += [str((ROOT / page).parent.relative_to(ROOT) / link) for link in re.findall(r"\]\(([^)#:]+)\)", text)]
    missing = [c for c in cited if not any(ch in c for ch in "*[") and "NAME" not in c and not (ROOT / c).exists()]
    assert cited and not missing, missing


@pytest.mark.parametrize("page", FIGURE_PAGES)
def test_figure_page_commands_parse(page):
    """Each complete ``oscarkv ...`` command in a code block of the page parses with today's flags
    (commands with ``...`` or ``[optional]`` parts are sketches and skipped)."""
    from oscarkv.cli.main import build_parser

    blocks = re.findall(r"```\n(.*?)```", (ROOT / page).read_text(), flags=re.S)
    lines = [ln.split("  #")[0].strip() for b in blocks for ln in b.replace("\\\n", " ").splitlines()]
    commands = [ln for ln in lines if ln.startswith("oscarkv ") and "..." not in ln and "[" not in ln]
    assert commands
    for command in commands:
        try:
            build_parser().parse_args(shlex.split(command)[1:])
        except SystemExit:
            pytest.fail(f"{page}: command does not parse: {command}")
