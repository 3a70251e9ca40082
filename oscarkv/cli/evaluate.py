"""``oscarkv eval``: long-context accuracy per KV method (RULER-style tasks, decode-faithful perplexity)."""

from __future__ import annotations

import argparse
from pathlib import Path

from oscarkv.cli.flags import UserError, add_fields, config_from, csv, load, model_args
from oscarkv.config import CACHE_DIR, EvalConfig, KVConfig


def setup(p: argparse.ArgumentParser) -> None:
    """Measure long-context accuracy (RULER-style tasks, decode-faithful perplexity) per KV method."""
    model_args(p, "auto")
    p.add_argument("--rotations", type=csv(), default=None, metavar="[NAME=]DIR,...",
                   help="artifact directories for 'oscar', comma-separated; NAME=DIR entries add variants reported "
                        "as oscar:NAME (ablations) (default: the default model's artifact, shipped with oscarkv)")
    p.add_argument("--out", type=Path, required=True, help="directory for results.json, results.md and plots")
    p.add_argument("--contexts", type=csv(int), default=EvalConfig().contexts, metavar="CONTEXTS",
                   help=f"prompt lengths in tokens, comma-separated (default: {','.join(map(str, EvalConfig().contexts))})")
    p.add_argument("--windows", choices=["both", "on", "off"], default="both",
                   help="BF16 sink/recent windows for low-bit methods (default: both)")
    p.add_argument("--sink", type=int, default=KVConfig().sink, help=f"BF16 sink tokens (default: {KVConfig().sink})")
    p.add_argument("--recent", type=int, default=KVConfig().recent,
                   help=f"BF16 recent window tokens (default: {KVConfig().recent})")
    p.add_argument("--cache-dir", type=Path, default=CACHE_DIR,
                   help=f"where artifacts calibrated at start-up are cached, by model fingerprint (default: {CACHE_DIR})")
    add_fields(p, EvalConfig, ["methods", "tasks", "samples", "seed", "haystacks", "diagnostic", "free", "bf16_on_engine",
                                  "batch"])
    p.add_argument("--backend", choices=["hf", "engine"], default="engine",
                   help="engine: free-running greedy generation through the paged engine as served (the headline), "
                        "with the teacher-forced diagnostic beside it; hf: the teacher-forced single-chunk "
                        "protocol alone (default: engine)")


def run(args: argparse.Namespace) -> int:
    from oscarkv.eval.report import write_report
    from oscarkv.eval.runner import evaluate

    windows = {"both": (True, False), "on": (True,), "off": (False,)}[args.windows]
    kv = config_from(KVConfig, argparse.Namespace(sink=args.sink, recent=args.recent))
    cfg = config_from(EvalConfig, args, windows=windows, kv=kv)
    loaded = load(args.model, args.dtype, args.device)
    artifacts = artifacts_for(loaded, args) if "oscar" in cfg.methods else None
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        with open(args.out / "samples.jsonl", "w") as log_file:
            records, meta = evaluate(loaded, cfg, artifacts, log_file, args.backend)
    except ValueError as e:
        raise UserError(str(e)) from e
    write_report(records, args.out, meta)
    print((args.out / "results.md").read_text())
    return 0


def artifacts_for(loaded, args) -> dict:
    """``{variant name: artifact}`` from ``--rotations`` (without it: the default model's shipped artifact,
    or one calibrated once and cached under ``--cache-dir``)."""
    from oscarkv.calibrate.default import cached_artifact
    from oscarkv.quant.artifact import Artifact, ArtifactError, ModelFingerprint

    if args.rotations is None:
        try:
            return {"": cached_artifact(loaded, args.cache_dir)}
        except ValueError as e:  # ArtifactError names the damaged cache file
            raise UserError(str(e)) from e
    fp, out = ModelFingerprint.from_config(loaded.config), {}
    for entry in args.rotations:
        name, _, path = entry.rpartition("=")
        try:
            out[name] = Artifact.load(Path(path), expect=fp)
        except ArtifactError as e:
            raise UserError(str(e)) from e
    return out
