"""``oscarkv import-rotations``: the OSCAR reference's published rotation files → our artifact directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from oscarkv.cli.flags import UserError, add_fields, config_from
from oscarkv.config import ReferenceRecipe


def setup(p: argparse.ArgumentParser) -> None:
    """Import the reference's k_rotation_*.pt / v_rotation_*.pt for a model into an oscarkv artifact."""
    p.add_argument("dir", type=Path, metavar="DIR", help="folder holding one k_rotation_*.pt and one v_rotation_*.pt")
    p.add_argument("--model", required=True,
                   help="the model the rotations are for: 'default', a model directory, a .gguf file or a hub id "
                        "ORG/NAME[@REVISION] (only its config is read)")
    p.add_argument("--out", type=Path, required=True, help="artifact directory to write")
    add_fields(p, ReferenceRecipe, ["key_clip", "value_clip", "group_size", "sink", "recent"])


def run(args: argparse.Namespace) -> int:
    from oscarkv.models.loader import ModelLoadError, bf16_layers, load_config
    from oscarkv.quant.reference import ReferenceFormatError, import_rotations

    if not args.dir.is_dir():
        raise UserError(f"rotation folder not found: {args.dir}")
    recipe = config_from(ReferenceRecipe, args)
    try:
        config = load_config(args.model)
        art = import_rotations(args.dir, config, recipe, bf16_layers(config))
    except (ModelLoadError, ReferenceFormatError) as e:
        raise UserError(str(e)) from e
    art.save(args.out)
    opts = art.manifest["options"]
    print(f"wrote {args.out}: {art.fingerprint.num_layers} layers, G={art.manifest['group_size']}, "
          f"clips {recipe.key_clip:g}/{recipe.value_clip:g}"
          + (f", overrides {opts['overrides']}" if opts["overrides"] else ", the reference's published recipe"))
    return 0
