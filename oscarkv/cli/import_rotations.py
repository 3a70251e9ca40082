"""``oscarkv import-rotations``: the OSCAR reference's published rotation files → our artifact directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from oscarkv.cli.flags import UserError, add_fields, config_from, load, model_args
from oscarkv.config import ReferenceRecipe


def setup(p: argparse.ArgumentParser) -> None:
    """Import the reference's k_rotation_*.pt / v_rotation_*.pt for a model into an oscarkv artifact."""
    p.add_argument("dir", type=Path, metavar="DIR", help="folder holding one k_rotation_*.pt and one v_rotation_*.pt")
    model_args(p, "float32")
    p.add_argument("--out", type=Path, required=True, help="artifact directory to write")
    add_fields(p, ReferenceRecipe, ["key_clip", "value_clip", "group_size", "sink", "recent"])


def run(args: argparse.Namespace) -> int:
    from oscarkv.models.loader import bf16_layers
    from oscarkv.quant.reference import ReferenceFormatError, import_rotations

    if not args.dir.is_dir():
        raise UserError(f"rotation folder not found: {args.dir}")
    recipe = config_from(ReferenceRecipe, args)
    loaded = load(args.model, args.dtype)
    try:
        art = import_rotations(args.dir, loaded.config, recipe, bf16_layers(loaded.config))
    except ReferenceFormatError as e:
        raise UserError(str(e)) from e
    art.save(args.out)
    opts = art.manifest["options"]
    print(f"wrote {args.out}: {art.fingerprint.num_layers} layers, G={art.manifest['group_size']}, "
          f"clips {recipe.key_clip:g}/{recipe.value_clip:g}"
          + (f", overrides {opts['overrides']}" if opts["overrides"] else ", the reference's published recipe"))
    return 0
