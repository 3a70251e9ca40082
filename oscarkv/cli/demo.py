"""``oscarkv demo``: the default model's needle retrieval with the unquantized cache, naive INT2, QuaRot-style
INT2 and OSCAR, and OSCAR's frontier: the shipped recipe (4-bit keys in the layers that need them, within INT2's
bytes) beside the uniform INT2 recipe shipped before it and K4V2, each with its bits per element. The
unquantized row is labelled with the dtype it stores: ``fp32`` on a CPU, ``bf16`` on a GPU.

The headline is what ``serve`` returns: the unquantized cache and OSCAR with its BF16 windows answer
free-running (greedy generation, OSCAR through the paged engine's chunked prefill and decode); every
configuration also gets the teacher-forced single-chunk diagnostic on the same samples, printed beside
it (the only figure for the configurations not run free, which would each cost one more prefill). The
frontier's recipes are the artifact's rotations with another recipe
(:func:`oscarkv.calibrate.default.frontier_artifacts`), reported as ``oscarkv eval --rotations NAME=DIR`` reports
them: ``oscar+win`` (the artifact's own recipe), ``oscar:int2+win``, ``oscar:k4v2+win``."""

from __future__ import annotations

import argparse
from pathlib import Path

from oscarkv.config import CACHE_DIR


def setup(p: argparse.ArgumentParser) -> None:
    """Compare unquantized (fp32 on a CPU, bf16 on a GPU), naive, quarot and oscar KV caches, and oscar's shipped
    recipe against uniform INT2 and K4V2, on needle retrieval at 4K with the default model."""
    p.add_argument("--samples", type=int, default=4, help="samples per context (default: 4)")
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="report directory (default: runs/demo)")
    p.add_argument("--rotations", type=Path, default=None,
                   help="OSCAR artifact directory, e.g. from 'oscarkv calibrate --model default --out DIR' "
                        "(default: the artifact shipped with the package)")
    p.add_argument("--cache-dir", type=Path, default=CACHE_DIR,
                   help=f"where the default model's artifact is cached when the shipped one does not fit "
                        f"(default: {CACHE_DIR})")


def demo_config(args: argparse.Namespace):
    """The demo's :class:`~oscarkv.config.EvalConfig`: the single needle at 4K on one haystack."""
    from oscarkv.cli.flags import config_from
    from oscarkv.config import EvalConfig

    # NOTE: one haystack and one context keep the README's first command short (each OSCAR recipe is one more
    # free run per sample through the engine; at 4K is where uniform INT2 loses needles as served); `oscarkv eval`
    # measures both haystacks at any context. Batch 1: the progress bar advances after each sample (a batch's free
    # runs end together); the answers are the same
    return config_from(EvalConfig, args, methods=("bf16", "naive", "quarot", "oscar"), tasks=("niah_single",),
                       contexts=(4096,), haystacks=("eval",), free=("bf16", "oscar"), bf16_on_engine=False,
                       batch=1)


def legend(artifacts: dict) -> list[str]:
    """One line per OSCAR configuration with windows: its report label and the recipe it serves."""
    from oscarkv.config import KVConfig
    from oscarkv.quant.artifact import apply_recipe

    lines = []
    for name, art in artifacts.items():
        kv = apply_recipe(KVConfig(group_size=art.manifest["group_size"]), art)
        keys = "".join(map(str, kv.layer_key_bits)) if kv.layer_key_bits else kv.key_bits
        heads = sum(map(len, kv.layer_key_heads))
        keys = f"{keys}, 4-bit keys in {heads} KV heads" if heads else keys
        lines.append(f"{'oscar:' + name if name else 'oscar'}+win: sink {kv.sink}, recent {kv.recent}, "
                     f"key bits {keys}, value bits {kv.value_bits}, key clip {kv.key_clip}")
    return lines


def run(args: argparse.Namespace) -> int:
    from oscarkv.calibrate.default import RECALIBRATE, artifact_for, frontier_artifacts
    from oscarkv.cli.flags import UserError, load
    from oscarkv.eval.report import write_report
    from oscarkv.eval.runner import evaluate

    cfg = demo_config(args)
    loaded = load("default", "auto")
    try:
        artifacts = frontier_artifacts(artifact_for(loaded, "oscar", args.rotations, args.cache_dir))
    except ValueError as e:
        raise UserError(str(e)) from e
    records, meta = evaluate(loaded, cfg, artifacts, backend="engine")
    write_report(records, args.out, meta)
    print((args.out / "results.md").read_text())
    print("\n".join(legend(artifacts)))
    print(f"report, plot and JSON in {args.out}")
    print(f"to recalibrate the OSCAR rotations: {RECALIBRATE.replace('--rotations', 'oscarkv demo --rotations')}")
    return 0
