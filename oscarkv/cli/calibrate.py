"""``oscarkv calibrate``: attention statistics of a model → rotations and clips → an artifact directory."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from oscarkv.cli.flags import UserError, add_fields, config_from, load, model_args
from oscarkv.config import CalibrationConfig, RecipeSearchConfig


def setup(p: argparse.ArgumentParser) -> None:
    """Fit OSCAR rotations and clips from attention statistics and write the artifact."""
    model_args(p, "float32", "cpu")  # NOTE: the host holds the model; --stream-layers runs the passes on a GPU
    p.add_argument("--data", type=Path, action="append", default=None, metavar="FILE",
                   help="calibration text file, repeat for several (default: the shipped calibration text)")
    p.add_argument("--out", type=Path, required=True, help="artifact directory to write")
    p.add_argument("--ablations", action="store_true",
                   help="also write one artifact per ablation under OUT/ablations/, from the same statistics "
                        "(default: off)")
    add_fields(p, CalibrationConfig, ["tokens", "heldout_tokens", "chunk", "rotation", "value_objective",
                                      "share_heads", "center", "scaling", "clip", "group_size", "seed",
                                      "stream_layers", "query_weighting"])
    p.add_argument("--rotations", type=Path, default=None, metavar="DIR",
                   help="choose the recipe (--max-bpe or --tolerance) for this existing artifact instead of fitting "
                        "one; the artifact is written to --out with its recipe (default: fit)")
    add_fields(p, RecipeSearchConfig, ["max_bpe", "context", "tolerance", "dev_samples", "dev_context", "dev_seeds",
                                       "sinks", "recents", "pages", "rungs", "key_clips", "levels", "protocol",
                                       "allocate"])


def run(args: argparse.Namespace) -> int:
    from oscarkv.calibrate.run import ABLATIONS, calibrate_variants, format_summary

    texts, desc = None, None
    if args.data:
        missing = [str(f) for f in args.data if not f.is_file()]
        if missing:
            raise UserError(f"calibration data not found: {', '.join(missing)}")
        texts, desc = [f.read_text() for f in args.data], ", ".join(str(f) for f in args.data)
    search = config_from(RecipeSearchConfig, args)
    if args.rotations is not None:
        return _search_only(args, search)
    cfg = config_from(CalibrationConfig, args)
    cfgs = {"": cfg} | ({name: replace(cfg, **change) for name, change in ABLATIONS.items()} if args.ablations else {})
    loaded = load(args.model, args.dtype, args.device)
    try:
        results = calibrate_variants(loaded, cfgs, texts, desc)
    except ValueError as e:
        raise UserError(str(e)) from e
    if search.max_bpe is not None or search.tolerance is not None:
        from oscarkv.eval.objective import search_recipe

        search_recipe(loaded, results, search, args.out)
    else:
        _validated_recipe(loaded, results[""][0])
    for name, (artifact, rows) in results.items():
        artifact.save(args.out / "ablations" / name if name else args.out)
        print(format_summary(rows) if not args.ablations else f"{name or 'recipe':>13s} {format_summary(rows).splitlines()[-1]}")
    seconds = results[""][0].manifest["calibration"]["seconds"]
    print(f"wrote {args.out}" + (f" and {len(ABLATIONS)} ablations under {args.out / 'ablations'}" if args.ablations else "")
          + f" ({seconds:.1f} s{_peak_gpu_memory()})")
    return 0


def _validated_recipe(loaded, artifact) -> None:
    """The default model fitted with the validated options gets the recipe the development search chose for
    them (``oscarkv/data/default_recipe.json``): the shipped artifact in full; the line says so."""
    from oscarkv.calibrate.default import attach_validated_recipe

    provenance = attach_validated_recipe(loaded, artifact)
    if provenance:
        print(f"serving recipe: the validated one for the default model ({provenance})")


def _peak_gpu_memory() -> str:
    """``, peak GPU memory X GiB`` when the passes ran on a GPU (``--stream-layers``), else nothing."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.max_memory_allocated() == 0:
        return ""
    return f", peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"


def _search_only(args: argparse.Namespace, search: RecipeSearchConfig) -> int:
    """``--rotations DIR``: the recipe search alone, on an artifact fitted before."""
    from oscarkv.calibrate.run import fit_missing_levels
    from oscarkv.eval.objective import search_recipe
    from oscarkv.quant.artifact import Artifact, ArtifactError, ModelFingerprint

    if search.max_bpe is None and search.tolerance is None:
        raise UserError("--rotations DIR only chooses a recipe: give --max-bpe B (with --context N) or --tolerance T")
    loaded = load(args.model, args.dtype, args.device)
    try:
        art = Artifact.load(args.rotations, expect=ModelFingerprint.from_config(loaded.config))
        if "lloyd_max" in search.levels and fit_missing_levels(loaded, art):
            print("fitted Lloyd-Max level tables on the artifact's held-out tokens (key.levels, value.levels)")
        search_recipe(loaded, {"": (art, [])}, search, args.out)
    except (ArtifactError, ValueError) as e:
        raise UserError(str(e)) from e
    art.save(args.out)
    print(f"wrote {args.out}")
    return 0
