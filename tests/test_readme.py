"""The README's Python snippets run as written, on the real default model.

Each ```python block of README.md is executed on its own (a fresh namespace, so none leans on
another's names) in a scratch working directory holding ``rotations/``, the directory the README's
``oscarkv calibrate --model default --out rotations/`` writes: here a copy of the artifact shipped
in the package, which that command made (calibrating anew would take minutes of CI time).
"""

import contextlib
import io
import re
import shlex
import shutil
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A directory with ``rotations/``: the default model's artifact."""
    from oscarkv.data import default_rotations_dir

    path = tmp_path_factory.mktemp("readme")
    shutil.copytree(default_rotations_dir(), path / "rotations")
    return path


def test_readme_has_the_two_setup_commands_first():
    first = re.search(r"```bash\n(.*?)```", README.read_text(), flags=re.S).group(1).splitlines()
    assert first == ["bash scripts/install.sh eval && .venv/bin/oscarkv demo",
                     "bash scripts/install.sh test && .venv/bin/python -m pytest -q"]
    ci = (README.parent / ".ci" / "run").read_text()
    install, tests = first[1].split(" && ")
    assert f"{install} && .venv/bin/ruff check . && {tests}" in ci, "CI must run the README's test command after the linter"


def test_readme_has_no_parent_links():
    assert "](../" not in README.read_text() and "`../" not in README.read_text()


def readme_commands() -> list[str]:
    """Every ``oscarkv ...`` command of the README: lines of its bash blocks, code spans with flags."""
    text = README.read_text()
    lines = [ln.split("  #")[0].strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)
             for ln in block.replace("\\\n", " ").splitlines()]
    lines += [span for span in re.findall(r"`(oscarkv [^`]*)`", text) if " --" in span]
    return sorted({ln.removeprefix(".venv/bin/") for ln in lines if ln.startswith(("oscarkv ", ".venv/bin/oscarkv "))})


def test_readme_commands_parse():
    """Each command the README shows is accepted by today's ``oscarkv`` parser (flags, list syntax)."""
    from oscarkv.cli.main import build_parser

    commands = readme_commands()
    assert len(commands) >= 10
    for command in commands:
        try:
            build_parser().parse_args(shlex.split(command)[1:])
        except SystemExit:
            pytest.fail(f"README command does not parse: {command}")


def test_readme_has_python_snippets():
    assert len(SNIPPETS) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_runs_as_written(index, workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(SNIPPETS[index], f"README.md snippet {index + 1}", "exec"), {"__name__": "__readme__"})
    assert printed.getvalue().strip(), "every snippet prints its result"
