"""Committed public-domain text used offline: calibration and evaluation come from different sources.

* ``calibration.txt`` — prose (Conan Doyle, *The Adventures of Sherlock Holmes*); fed to
  ``oscarkv calibrate`` to fit rotations and clips.
* ``eval.txt`` — verse drama (Shakespeare, "tinyshakespeare"); the haystack of the synthetic
  tasks (``oscarkv.eval.tasks``) and the perplexity windows (``oscarkv.eval.perplexity_data``).

``SOURCES.md`` states where each came from, why it is public domain and which slice was kept.

One derived file ships too: ``default_rotations/`` (:func:`default_rotations_dir`), the OSCAR
artifact of the default model (``rotations.safetensors`` + ``manifest.json``, ~6 MB), made by
``oscarkv calibrate --model default --out oscarkv/data/default_rotations`` from
``calibration.txt`` with the recipe's defaults, so that the default model starts without the
one-time calibration (``oscarkv.calibrate.default``).
The files ship as package data (``[tool.setuptools.package-data]`` in ``pyproject.toml``).
"""

from __future__ import annotations

import pathlib
from importlib import resources

NAMES = ("calibration.txt", "eval.txt")
"""The text files this package holds."""

DEFAULT_ROTATIONS = "default_rotations"
"""The folder of the default model's shipped OSCAR artifact."""


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


def default_rotations_dir() -> pathlib.Path:
    """Folder of the default model's shipped artifact (loading validates it: ``oscarkv.quant.artifact``)."""
    return pathlib.Path(str(resources.files(__name__).joinpath(DEFAULT_ROTATIONS)))
