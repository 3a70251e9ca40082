"""The rotation artifact a run uses when the caller names none.

Role: :func:`artifact_for` is how ``LLM``, ``serve``, ``generate``, ``eval`` and the CPU engine
bench find the artifact for ``kv="oscar"``: the directory the caller gives, validated against
the model, or — for the embedded default model only — :func:`default_artifact`, the cached
calibration under ``<cache_dir>/rotations/<config hash>``, fitted once with the current recipe
(:class:`~oscarkv.config.CalibrationConfig`) and refitted when the recipe changes. No printing:
progress goes to the ``oscarkv`` logger.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

from oscarkv.calibrate.run import calibrate, format_summary
from oscarkv.config import CACHE_DIR, CalibrationConfig
from oscarkv.models.loader import LoadedModel, is_default_model
from oscarkv.quant.artifact import Artifact, ArtifactError, ModelFingerprint

log = logging.getLogger("oscarkv")


def default_artifact(loaded: LoadedModel, cache_dir: Path = CACHE_DIR) -> Artifact:
    """The default model's artifact from ``cache_dir``, calibrated once if missing or stale."""
    fp = ModelFingerprint.from_config(loaded.config)
    path = cache_dir / "rotations" / fp.config_hash
    recipe = json.loads(json.dumps(asdict(CalibrationConfig())))  # as the manifest stores it
    try:
        artifact = Artifact.load(path, expect=fp)
        if artifact.manifest.get("options") == recipe:
            return artifact
        log.info("the cached artifact %s was fitted with other options than the current recipe", path)
    except ArtifactError as e:
        log.info("calibrating the default model once (%s) -> %s", e, path)
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
