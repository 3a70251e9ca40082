"""Committed public-domain text used offline: calibration and evaluation come from different sources.

* ``calibration.txt`` — prose (Conan Doyle, *The Adventures of Sherlock Holmes*); fed to
  ``oscarkv calibrate`` to fit rotations and clips.
* ``eval.txt`` — verse drama (Shakespeare, "tinyshakespeare"); the haystack of the synthetic
  tasks (``oscarkv.eval.tasks``) and the perplexity windows (``oscarkv.eval.perplexity_data``).

``SOURCES.md`` states where each came from, why it is public domain and which slice was kept.
The files ship as package data (``[tool.setuptools.package-data] "oscarkv.data" = ["*.txt", "*.md"]``).
"""

from __future__ import annotations

import pathlib
from importlib import resources

NAMES = ("calibration.txt", "eval.txt")
"""The text files this package holds."""


def data_path(name: str) -> pathlib.Path:
    """Filesystem path of a bundled data file, e.g. ``data_path("eval.txt")``."""
    if name not in NAMES:
        raise FileNotFoundError(f"oscarkv.data has no {name!r}; available: {NAMES}")
    path = pathlib.Path(str(resources.files(__name__).joinpath(name)))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: was the package installed without its package data?")
    return path


def read_text(name: str) -> str:
    """Contents of a bundled data file (UTF-8)."""
    return data_path(name).read_text(encoding="utf-8")
