"""``oscarkv demo``: the default model's needle retrieval with the unquantized cache, naive INT2, QuaRot-style
INT2 and OSCAR. The unquantized row is labelled with the dtype it stores: ``fp32`` on a CPU, ``bf16`` on a GPU.

The headline is what ``serve`` returns: the unquantized cache and OSCAR with its BF16 windows answer
free-running (greedy generation, OSCAR through the paged engine's chunked prefill and decode); every
configuration also gets the teacher-forced single-chunk diagnostic on the same samples, printed beside
it (the only figure for the configurations not run free, which would each cost one more prefill)."""

from __future__ import annotations

import argparse
from pathlib import Path

from oscarkv.config import CACHE_DIR


def setup(p: argparse.ArgumentParser) -> None:
    """Compare unquantized (fp32 on a CPU, bf16 on a GPU), naive, quarot and oscar KV caches on needle retrieval
    at 2K-4K with the default model."""
    p.add_argument("--samples", type=int, default=4, help="samples per context (default: 4)")
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="report directory (default: runs/demo)")
    p.add_argument("--rotations", type=Path, default=None,
                   help="OSCAR artifact directory, e.g. from 'oscarkv calibrate --model default --out DIR' "
                        "(default: the artifact shipped with the package)")
    p.add_argument("--cache-dir", type=Path, default=CACHE_DIR,
                   help=f"where the default model's artifact is cached when the shipped one does not fit "
                        f"(default: {CACHE_DIR})")


def run(args: argparse.Namespace) -> int:
    from oscarkv.calibrate.default import RECALIBRATE, artifact_for
    from oscarkv.cli.flags import UserError, config_from, load
    from oscarkv.config import EvalConfig
    from oscarkv.eval.report import write_report
    from oscarkv.eval.runner import evaluate

    # NOTE: one haystack keeps the README's first command short; `oscarkv eval` measures both. Batch 1: the
    # progress bar advances after each sample (a batch's free runs end together); the answers are the same
    cfg = config_from(EvalConfig, args, methods=("bf16", "naive", "quarot", "oscar"), tasks=("niah_single",),
                      contexts=(2048, 4096), haystacks=("eval",), free=("bf16", "oscar"), bf16_on_engine=False,
                      batch=1)
    loaded = load("default", "auto")
    try:
        artifact = artifact_for(loaded, "oscar", args.rotations, args.cache_dir)
    except ValueError as e:
        raise UserError(str(e)) from e
    records, meta = evaluate(loaded, cfg, {"": artifact}, backend="engine")
    write_report(records, args.out, meta)
    print((args.out / "results.md").read_text())
    print(f"report, plot and JSON in {args.out}")
    print(f"to recalibrate the OSCAR rotations: {RECALIBRATE.replace('--rotations', 'oscarkv demo --rotations')}")
    return 0
