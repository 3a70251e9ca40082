"""``oscarkv export-rotations``: our artifact → rotation files in the OSCAR reference's format."""

from __future__ import annotations

import argparse
from pathlib import Path

from oscarkv.cli.flags import UserError


def setup(p: argparse.ArgumentParser) -> None:
    """Write an artifact's rotations as the reference's k_rotation_*.pt / v_rotation_*.pt."""
    p.add_argument("artifact", type=Path, metavar="ART", help="artifact directory (from calibrate or import-rotations)")
    p.add_argument("--out", type=Path, required=True, help="folder to write the two .pt files into")
    p.add_argument("--name", default=None,
                   help="file name part: k_rotation_NAME.pt (default: the imported files' names, else ARCH-CONFIGHASH)")


def run(args: argparse.Namespace) -> int:
    from oscarkv.quant.artifact import Artifact, ArtifactError
    from oscarkv.quant.reference import export_rotations

    try:
        art = Artifact.load(args.artifact)
    except ArtifactError as e:
        raise UserError(str(e)) from e
    paths, dropped = export_rotations(art, args.out, args.name)
    print("wrote " + ", ".join(str(p) for p in paths))
    print("not carried by the reference format: " + "; ".join(dropped))
    return 0
