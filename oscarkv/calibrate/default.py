"""The rotation artifact a run uses when the caller names none, and the default model's validated recipe.

Role: :func:`artifact_for` is how ``LLM``, ``serve``, ``generate``, ``eval`` and the CPU engine
bench find the artifact for ``kv="oscar"``: the directory the caller gives, validated against
the model, or else :func:`cached_artifact`, for any model:

1. the default model only: the artifact shipped in the package (``oscarkv/data/default_rotations``,
   made by ``oscarkv calibrate --model default``), when it fits the loaded model and was fitted with
   the current recipe (:class:`~oscarkv.config.CalibrationConfig`): no calibration at start-up;
2. else the artifact cached under ``<cache_dir>/rotations/<config hash>`` (the model's
   :class:`~oscarkv.quant.artifact.ModelFingerprint`), when it was fitted for that fingerprint with
   the current recipe;
3. else one calibration at start-up (:func:`startup_config`: the recipe's options on the bundled
   calibration text, streamed one decoder layer at a time on the GPU where there is one), saved there.
   A cache fitted for another fingerprint or with other options is refitted; one that cannot be read
   is an :class:`~oscarkv.quant.artifact.ArtifactError` naming the file (never silently replaced).

:func:`attach_validated_recipe` is how ``oscarkv calibrate --model default`` (and step 3 for the
default model) reproduces the shipped artifact in full: the serving recipe the development search
chose is data (``oscarkv/data/default_recipe.json``, with the options it holds for and its provenance),
written into an artifact fitted from the default model with those options, never re-searched.
:func:`frontier_artifacts` puts the reference recipes that file also holds (the uniform INT2 recipe shipped
before, K4V2) on an artifact's rotations: the points ``oscarkv demo`` compares the shipped recipe with.

No printing: which artifact was used, and any calibration, goes to the ``oscarkv`` logger.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from oscarkv.calibrate.run import DEFAULT_TEXT, calibrate, format_summary
from oscarkv.calibrate.stream import STREAMABLE
from oscarkv.config import CACHE_DIR, CalibrationConfig
from oscarkv.data import default_recipe, default_rotations_dir
from oscarkv.models.loader import LoadedModel, is_default_model
from oscarkv.quant.artifact import FORMAT_VERSION, MANIFEST_FILE, Artifact, ArtifactError, ModelFingerprint

log = logging.getLogger("oscarkv")

RECALIBRATE = "oscarkv calibrate --model default --out DIR, then --rotations DIR"
"""How a user refits the default model's rotations (the demo prints it)."""


def as_stored(options: dict) -> dict:
    """Options as a saved manifest holds them (JSON types: lists, not tuples)."""
    return json.loads(json.dumps(options))


def current_recipe() -> dict:
    """The recipe's options as a manifest stores them."""
    return as_stored(CalibrationConfig().options())


def attach_validated_recipe(loaded: LoadedModel, artifact: Artifact) -> str | None:
    """Write the default model's validated serving recipe into ``artifact`` (fitted from ``loaded``) when
    ``loaded`` is the default model, the artifact was fitted with the options the recipe holds for, its
    per-layer bits (or per-head ones) name each of the artifact's layers, and it carries no recipe yet; return the recipe's
    provenance, else ``None`` (nothing written)."""
    entry = default_recipe()
    fitted_with = as_stored(artifact.manifest["options"])  # a fresh artifact's manifest holds tuples
    layers = artifact.fingerprint.num_layers
    fits = all(len(entry["recipe"].get(f"layer_{kind}", ())) in (0, layers) for kind in ("key_bits", "value_bits", "key_heads"))
    if not is_default_model(loaded) or "recipe" in artifact.manifest or fitted_with != entry["options"] or not fits:
        return None
    artifact.manifest["recipe"] = entry["recipe"]
    return entry["provenance"]


def frontier_artifacts(artifact: Artifact) -> dict[str, Artifact]:
    """``artifact`` and the default model's reference recipes on its rotations, by variant name as ``oscarkv eval
    --rotations NAME=DIR`` reports them (``oscar:NAME+win``): ``""`` the artifact as it is (the shipped one: the
    validated per-layer allocation), ``int2`` the uniform INT2 recipe shipped before it, ``k4v2`` 4-bit keys at
    INT2's windows (``oscarkv/data/default_recipe.json``'s ``frontier``)."""
    return {"": artifact, **{name: artifact.with_recipe(recipe) for name, recipe in default_recipe()["frontier"].items()}}


def startup_config(loaded: LoadedModel) -> CalibrationConfig:
    """The calibration run at start-up: the recipe's options (so the next start reuses it), streamed one
    decoder layer at a time on the GPU where there is one (the same artifact; less GPU memory)."""
    arch = (getattr(loaded.config, "architectures", None) or [None])[0]
    return CalibrationConfig(stream_layers=torch.cuda.is_available() and arch in STREAMABLE)


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


def _cached(path: Path, fp: ModelFingerprint) -> Artifact | None:
    """The artifact cached at ``path`` when it was fitted for ``fp`` with the current recipe; ``None`` when
    there is none or it is stale (logged: refitted); ``ArtifactError`` naming the file when it is unreadable."""
    if not path.exists():
        return None
    if _format_version(path) not in (None, FORMAT_VERSION):
        log.info("the cached artifact %s is of an older format: calibrating again", path)
        return None
    try:
        artifact = Artifact.load(path)
    except ArtifactError as e:
        raise ArtifactError(f"{e} (the cached artifact is damaged: delete {path} to calibrate again)") from e
    if artifact.fingerprint != fp or artifact.manifest.get("options") != current_recipe():
        log.info("the cached artifact %s was fitted for another model or recipe: calibrating again", path)
        return None
    return artifact


def _format_version(path: Path) -> object:
    """The ``format_version`` of the manifest at ``path``; ``None`` when there is no readable one."""
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    return manifest.get("format_version") if isinstance(manifest, dict) else None


def cached_artifact(loaded: LoadedModel, cache_dir: Path = CACHE_DIR) -> Artifact:
    """The model's artifact without a directory named: the shipped one (the default model), else the cached
    one, else calibrated once into the cache (module docstring)."""
    fp = ModelFingerprint.from_config(loaded.config)
    if is_default_model(loaded):
        shipped = _usable(default_rotations_dir(), fp, "the shipped artifact")
        if shipped is not None:
            log.info("OSCAR rotations: the shipped artifact %s (recalibrate: %s)", default_rotations_dir(), RECALIBRATE)
            return shipped
    path = cache_dir / "rotations" / fp.config_hash
    cached = _cached(path, fp)
    if cached is not None:
        log.info("OSCAR rotations: the cached artifact %s (calibrated once for this model; --rotations DIR overrides)",
                 path)
        return cached
    return _calibrate_into(loaded, path)


def _calibrate_into(loaded: LoadedModel, path: Path) -> Artifact:
    """Calibrate ``loaded`` once with :func:`startup_config`, save the artifact at ``path``, say where."""
    cfg = startup_config(loaded)
    device = next(loaded.model.parameters()).device
    where = f"streamed layer by layer on {torch.cuda.get_device_name()}" if cfg.stream_layers else f"on {device}"
    log.info("OSCAR rotations: no artifact for this model yet; calibrating once on %d + %d held-out tokens of "
             "oscarkv.data:%s (%s) -> %s", cfg.tokens, cfg.heldout_tokens, DEFAULT_TEXT, where, path)
    artifact, rows = calibrate(loaded, cfg)
    log.debug("%s", format_summary(rows))
    attach_validated_recipe(loaded, artifact)
    artifact.save(path)
    log.info("OSCAR rotations: calibrated in %.1f s and cached at %s (the next start reuses it; --rotations DIR "
             "overrides)", artifact.manifest["calibration"]["seconds"], path)
    return artifact


def artifact_for(loaded: LoadedModel, kv: str, rotations: str | Path | None,
                 cache_dir: Path = CACHE_DIR) -> Artifact | None:
    """The validated artifact for ``kv == "oscar"`` (``None`` for every other method).

    ``rotations`` names the artifact directory; without it, :func:`cached_artifact` (which may calibrate
    once). ``cache_dir``: where calibrated artifacts are cached."""
    if kv != "oscar":
        return None
    if rotations is not None:
        return Artifact.load(Path(rotations), expect=ModelFingerprint.from_config(loaded.config))
    return cached_artifact(loaded, cache_dir)
