"""Subcommand implementations for ``oscarkv`` (argument setup and the run function of each)."""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict
from pathlib import Path

import torch

from oscarkv.cli import DEFAULT_CACHE, add_fields, pick
from oscarkv.bench.cli import run_bench, setup_bench
from oscarkv.config import CalibrationConfig, EvalConfig, KVConfig

log = logging.getLogger("oscarkv")
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
"""Model compute dtypes; ``auto`` picks :func:`auto_dtype`."""


def auto_dtype() -> str:
    """``bfloat16`` where a GPU runs the model, ``float32`` on a CPU.

    NOTE: CPUs without native bf16 matmul (AVX2-only, like the CI machine) run a bf16 model
    4-5x slower than fp32; the KV cache under test stores BF16 windows either way."""
    return "bfloat16" if torch.cuda.is_available() else "float32"


class UserError(Exception):
    """A problem with the user's input, reported without a traceback."""


def _load(spec: str, dtype: str):
    from oscarkv.models.loader import ModelLoadError, load_model

    try:
        return load_model(spec, DTYPES[auto_dtype() if dtype == "auto" else dtype])
    except ModelLoadError as e:
        raise UserError(str(e)) from e


def _model_args(p: argparse.ArgumentParser, dtype: str) -> None:
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct GGUF), a HF model directory or a .gguf file")
    p.add_argument("--dtype", choices=["auto", *sorted(DTYPES)], default=dtype,
                   help=f"model compute dtype; auto: bfloat16 on CUDA, float32 on CPU (default {dtype})")


# ---------------------------------------------------------------------------------- calibrate
def setup_calibrate(p: argparse.ArgumentParser) -> None:
    """Fit OSCAR rotations and clips from attention statistics and write the artifact."""
    _model_args(p, "float32")
    p.add_argument("--data", nargs="*", type=Path, default=None, help="calibration text files (default: the shipped calibration text)")
    p.add_argument("--out", type=Path, required=True, help="artifact directory to write")
    p.add_argument("--ablations", action="store_true",
                   help="also write one artifact per ablation (oscarkv.calibrate.run.ABLATIONS) under OUT/ablations/, "
                        "from the same statistics")
    add_fields(p, CalibrationConfig, ["tokens", "heldout_tokens", "chunk", "rotation", "value_objective",
                                      "share_heads", "center", "scaling", "clip", "group_size", "seed"])


def run_calibrate(args: argparse.Namespace) -> int:
    loaded = _load(args.model, args.dtype)
    texts, desc = None, None
    if args.data:
        missing = [str(f) for f in args.data if not f.is_file()]
        if missing:
            raise UserError(f"calibration data not found: {', '.join(missing)}")
        texts, desc = [f.read_text() for f in args.data], ", ".join(str(f) for f in args.data)
    cfg = _config(CalibrationConfig, args)
    if args.ablations:
        return _calibrate_ablations(loaded, cfg, args.out, texts, desc)
    artifact = calibrate_to(loaded, cfg, args.out, texts, desc)
    print(f"wrote {args.out} ({artifact.manifest['calibration']['seconds']:.1f} s)")
    return 0


def _calibrate_ablations(loaded, cfg: CalibrationConfig, out: Path, texts, desc) -> int:
    from dataclasses import replace

    from oscarkv.calibrate.run import ABLATIONS, calibrate_variants, format_summary

    cfgs = {"": cfg} | {name: replace(cfg, **change) for name, change in ABLATIONS.items()}
    try:
        results = calibrate_variants(loaded, cfgs, texts, desc)
    except ValueError as e:
        raise UserError(str(e)) from e
    for name, (artifact, rows) in results.items():
        artifact.save(out / "ablations" / name if name else out)
        means = format_summary(rows).splitlines()[-1]
        print(f"{name or 'recipe':>13s} {means}")
    print(f"wrote {out} and {len(ABLATIONS)} ablations under {out / 'ablations'}")
    return 0


def _config(cls, args, **extra):
    try:
        return pick(cls, args, **extra)
    except ValueError as e:
        raise UserError(str(e)) from e


def calibrate_to(loaded, cfg: CalibrationConfig, out: Path, texts=None, desc=None):
    from oscarkv.calibrate.run import calibrate, format_summary

    try:
        artifact, rows = calibrate(loaded, cfg, texts, desc)
    except ValueError as e:
        raise UserError(str(e)) from e
    artifact.save(out)
    print(format_summary(rows))
    return artifact


def default_artifact(loaded, cache_dir: Path):
    """The default model's artifact from the cache directory, calibrated once if missing or stale."""
    from oscarkv.quant.artifact import Artifact, ArtifactError, ModelFingerprint

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
    return calibrate_to(loaded, CalibrationConfig(), path)


# ---------------------------------------------------------------------------------- eval
def setup_eval(p: argparse.ArgumentParser) -> None:
    """Measure long-context accuracy (RULER-style tasks, decode-faithful perplexity) per KV method."""
    _model_args(p, "auto")
    p.add_argument("--rotations", nargs="+", default=None, metavar="[NAME=]DIR",
                   help="artifact directory for 'oscar' (default model: calibrated on first use); "
                        "NAME=DIR entries add variants reported as oscar:NAME (ablations)")
    p.add_argument("--out", type=Path, required=True, help="directory for results.json, results.md and plots")
    p.add_argument("--context", dest="contexts", type=lambda s: tuple(int(x) for x in s.split(",")),
                   default=EvalConfig().contexts, help="prompt lengths in tokens, comma-separated")
    p.add_argument("--windows", choices=["both", "on", "off"], default="both", help="BF16 sink/recent windows for low-bit methods")
    p.add_argument("--sink", type=int, default=KVConfig().sink, help="BF16 sink tokens")
    p.add_argument("--recent", type=int, default=KVConfig().recent, help="BF16 recent window tokens")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where the default model's artifact is cached")
    add_fields(p, EvalConfig, ["methods", "tasks", "samples", "seed", "haystack"])
    p.add_argument("--backend", choices=["hf", "engine"], default="hf",
                   help="synthetic tasks through transformers + OscarCache (hf) or the paged engine (engine)")


def run_eval(args: argparse.Namespace) -> int:
    from oscarkv.eval.report import write_report
    from oscarkv.eval.runner import evaluate

    windows = {"both": (True, False), "on": (True,), "off": (False,)}[args.windows]
    kv = _config(KVConfig, argparse.Namespace(sink=args.sink, recent=args.recent))
    cfg = _config(EvalConfig, args, windows=windows, kv=kv, contexts=args.contexts)
    loaded = _load(args.model, args.dtype)
    artifacts = _artifacts_for(loaded, args) if "oscar" in cfg.methods else None
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        with open(args.out / "samples.jsonl", "w") as log_file:
            records, meta = evaluate(loaded, cfg, artifacts, log_file, args.backend)
    except ValueError as e:
        raise UserError(str(e)) from e
    write_report(records, args.out, meta)
    print((args.out / "results.md").read_text())
    return 0


def _artifacts_for(loaded, args) -> dict:
    from oscarkv.quant.artifact import Artifact, ArtifactError, ModelFingerprint

    if args.rotations is None:
        if args.model != "default":
            raise UserError("--rotations DIR is required for method 'oscar' (make one with: oscarkv calibrate --out DIR)")
        return {"": default_artifact(loaded, args.cache_dir)}
    fp, out = ModelFingerprint.from_config(loaded.config), {}
    for entry in args.rotations:
        name, _, path = entry.rpartition("=")
        try:
            out[name] = Artifact.load(Path(path), expect=fp)
        except ArtifactError as e:
            raise UserError(str(e)) from e
    return out


# ---------------------------------------------------------------------------------- report
def setup_report(p: argparse.ArgumentParser) -> None:
    """Rebuild results.json, results.md and plots of an eval run from its samples.jsonl (e.g. an interrupted run)."""
    p.add_argument("--run", type=Path, required=True, help="the eval --out directory holding samples.jsonl")


def run_report(args: argparse.Namespace) -> int:
    from oscarkv.eval.report import write_report
    from oscarkv.eval.runner import records_from_log

    log = args.run / "samples.jsonl"
    if not log.is_file():
        raise UserError(f"no samples.jsonl in {args.run}: point --run at an 'oscarkv eval --out' directory")
    records = records_from_log(log.read_text().splitlines())
    meta = {"rebuilt_from": str(log), "samples_logged": sum(1 for line in log.read_text().splitlines() if line.strip())}
    write_report(records, args.run, meta)
    print((args.run / "results.md").read_text())
    return 0


# ---------------------------------------------------------------------------------- demo
def setup_demo(p: argparse.ArgumentParser) -> None:
    """Calibrate the default model (cached), then compare bf16/naive/quarot/oscar on NIAH at 2K-4K."""
    p.add_argument("--samples", type=int, default=4, help="samples per context (default 4)")
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="report directory (default runs/demo)")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where the default model's artifact is cached")


def run_demo(args: argparse.Namespace) -> int:
    from oscarkv.eval.report import write_report
    from oscarkv.eval.runner import evaluate

    loaded = _load("default", "auto")
    artifact = default_artifact(loaded, args.cache_dir)
    cfg = EvalConfig(methods=("bf16", "naive", "quarot", "oscar"), tasks=("niah_single",),
                     contexts=(2048, 4096), samples=args.samples)
    records, meta = evaluate(loaded, cfg, {"": artifact})
    write_report(records, args.out, meta)
    print((args.out / "results.md").read_text())
    print(f"report, plot and JSON in {args.out}")
    return 0


COMMANDS = {
    "calibrate": (setup_calibrate, run_calibrate),
    "eval": (setup_eval, run_eval),
    "demo": (setup_demo, run_demo),
    "report": (setup_report, run_report),
    "bench": (setup_bench, run_bench),
}

from oscarkv.engine.cli import COMMANDS as _ENGINE_COMMANDS  # noqa: E402  (generate, bench-engine)

COMMANDS.update(_ENGINE_COMMANDS)

from oscarkv.server.cli import COMMANDS as _SERVER_COMMANDS  # noqa: E402  (serve, bench-serve)

COMMANDS.update(_SERVER_COMMANDS)
