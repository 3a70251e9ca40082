"""``oscarkv demo``: the default model's needle retrieval with BF16, naive INT2, QuaRot-style INT2 and OSCAR."""

from __future__ import annotations

import argparse
from pathlib import Path

from oscarkv.config import CACHE_DIR


def setup(p: argparse.ArgumentParser) -> None:
    """Compare bf16/naive/quarot/oscar KV caches on needle retrieval at 2K-4K with the default model."""
    p.add_argument("--samples", type=int, default=4, help="samples per context (default: 4)")
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="report directory (default: runs/demo)")
    p.add_argument("--cache-dir", type=Path, default=CACHE_DIR,
                   help=f"where the default model's artifact is cached (default: {CACHE_DIR})")


def run(args: argparse.Namespace) -> int:
    from oscarkv.calibrate.default import default_artifact
    from oscarkv.cli.flags import load
    from oscarkv.config import EvalConfig
    from oscarkv.eval.report import write_report
    from oscarkv.eval.runner import evaluate

    loaded = load("default", "auto")
    artifact = default_artifact(loaded, args.cache_dir)
    cfg = EvalConfig(methods=("bf16", "naive", "quarot", "oscar"), tasks=("niah_single",),
                     contexts=(2048, 4096), samples=args.samples)
    records, meta = evaluate(loaded, cfg, {"": artifact})
    write_report(records, args.out, meta)
    print((args.out / "results.md").read_text())
    print(f"report, plot and JSON in {args.out}")
    return 0
