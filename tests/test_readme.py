"""The README's Python snippets run as written, on the real default model.

Each ```python block of README.md is executed on its own (a fresh namespace, so none leans on
another's names) in a scratch working directory holding ``rotations/``, the artifact the README's
``oscarkv calibrate --model default --out rotations/`` writes. NOTE: that command streams 16K
calibration tokens (~2 minutes on two cores); the fixture fits the same artifact format from the
same recipe with fewer tokens, which changes the rotations' quality, not what the snippets do.
"""

import contextlib
import io
import re
from dataclasses import replace
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A directory with ``rotations/``: a small calibration of the default model."""
    from oscarkv.calibrate.run import calibrate
    from oscarkv.config import CalibrationConfig
    from oscarkv.models.loader import load_model

    path = tmp_path_factory.mktemp("readme")
    cfg = replace(CalibrationConfig(), tokens=256, chunk=128, heldout_tokens=64)
    artifact, _ = calibrate(load_model("default"), cfg)
    artifact.save(path / "rotations")
    return path


def test_readme_has_the_two_setup_commands_first():
    first = re.search(r"```bash\n(.*?)```", README.read_text(), flags=re.S).group(1).splitlines()
    assert first == ["bash scripts/install.sh eval && .venv/bin/oscarkv demo",
                     "bash scripts/install.sh test && .venv/bin/python -m pytest -q"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert first[1] in ci, "CI must run the README's test command"


def test_readme_has_no_parent_links():
    assert "](../" not in README.read_text() and "`../" not in README.read_text()


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
