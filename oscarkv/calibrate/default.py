"""The rotation artifact a run uses when the caller names none.

Role: :func:`artifact_for` is how ``LLM``, ``serve``, ``generate``, ``eval`` and the CPU engine
bench find the artifact for ``kv="oscar"``: the directory the caller gives, validated against
the model, or — for the embedded default model only — :func:`default_artifact`:

1. the artifact shipped in the package (``oscarkv/data/default_rotations``, made by
   ``oscarkv calibrate --model default``), when it fits the loaded model and was fitted with the
   current recipe (:class:`~oscarkv.config.CalibrationConfig`): no calibration at start-up;
2. else (the recipe changed, or the model's config hash did) the cached calibration under
   ``<cache_dir>/rotations/<config hash>``, fitted once with the current recipe and refitted when
   the recipe changes.

No printing: which artifact was used, and any calibration, goes to the ``oscarkv`` logger.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from oscarkv.calibrate.run import calibrate, format_summary
from oscarkv.config import CACHE_DIR, CalibrationConfig
from oscarkv.data import default_rotations_dir
from oscarkv.models.loader import LoadedModel, is_default_model
from oscarkv.quant.artifact import Artifact, ArtifactError, ModelFingerprint

log = logging.getLogger("oscarkv")

RECALIBRATE = "oscarkv calibrate --model default --out DIR, then --rotations DIR"
"""How a user refits the default model's rotations (the demo prints it)."""


def current_recipe() -> dict:
    """The recipe's options as a manifest stores them (JSON types: lists, not tuples)."""
    return json.loads(json.dumps(CalibrationConfig().options()))


def _usable(path: Path, fp: ModelFingerprint, what: str) -> Artifact | None:
    """The artifact at ``path`` if it fits ``fp`` and the current recipe; ``None`` (logged) if not."""
    try:
        artifact = Artifact.load(path, expect=fp)
    except ArtifactError as e:
        log.info("%s %s not used: %s", what, path, e)
        return None
    if artifact.manifest.get("options") != current_recipe():
        log.info("%s %s not used: fitted with other options than the current recipe", what, path)
        return None
    return artifact


def default_artifact(loaded: LoadedModel, cache_dir: Path = CACHE_DIR) -> Artifact:
    """The default model's artifact: the shipped one, else the cached one, else calibrated once into the cache."""
    fp = ModelFingerprint.from_config(loaded.config)
    shipped = _usable(default_rotations_dir(), fp, "the shipped artifact")
    if shipped is not None:
        log.info("OSCAR rotations: the shipped artifact %s (recalibrate: %s)", default_rotations_dir(), RECALIBRATE)
        return shipped
    path = cache_dir / "rotations" / fp.config_hash
    cached = _usable(path, fp, "the cached artifact")
    if cached is not None:
        return cached
    log.info("calibrating the default model once -> %s", path)
    artifact, rows = calibrate(loaded, CalibrationConfig())
    log.info("%s", format_summary(rows))
    artifact.save(path)
    return artifact


def artifact_for(loaded: LoadedModel, kv: str, rotations: str | Path | None,
                 cache_dir: Path = CACHE_DIR) -> Artifact | None:
    """The validated artifact for ``kv == "oscar"`` (``None`` for every other method).

    ``rotations`` names the artifact directory; without it the default model falls back to
    :func:`default_artifact` and any other model raises ``ValueError`` saying how to make one."""
    if kv != "oscar":
        return None
    fp = ModelFingerprint.from_config(loaded.config)
    if rotations is not None:
        return Artifact.load(Path(rotations), expect=fp)
    if is_default_model(loaded):
        return default_artifact(loaded, cache_dir)
    raise ValueError("kv='oscar' needs rotations=DIR (make one with: oscarkv calibrate --model MODEL --out DIR)")
