"""The docs hold together: design citations resolve, figure pages stay short, cited files exist.

Every "DESIGN.md §N" in the code and docs names a section of docs/DESIGN.md; nothing cites a
design file outside the repository; docs/RESULTS.md, DEVELOPMENT.md and BENCHMARKS.md stay within 300 lines
(the round-by-round history lives in docs/lab/, frozen, and is not checked); every JSON file and
results directory those pages and the README name is committed.
"""

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for folder in ("oscarkv", "tests", "lab", "scripts") for p in (ROOT / folder).rglob("*")
           if p.suffix in (".py", ".md", ".sh")] + [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FIGURE_PAGES = ("docs/RESULTS.md", "lab/DEVELOPMENT.md", "docs/BENCHMARKS.md")


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


@pytest.mark.parametrize("page", FIGURE_PAGES + ("README.md",))
def test_cited_files_exist(page):
    """Backticked JSON names (BENCHMARKS.md's bare names live in lab/bench_gpu/), docs/ paths and links."""
    text = (ROOT / page).read_text()
    names = re.findall(r"`([^`\s]+\.json)`", text)
    cited = [n if "/" in n else f"lab/bench_gpu/{n}" for n in names if "/" in n or page == "docs/BENCHMARKS.md"]
    cited += [p.rstrip("/.,") for p in re.findall(r"`(docs/[^`\s]+)`", text)]
    cited += [str((ROOT / page).parent.relative_to(ROOT) / link) for link in re.findall(r"\]\(([^)#:]+)\)", text)]
    missing = [c for c in cited if not (ROOT / c).exists()]
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
