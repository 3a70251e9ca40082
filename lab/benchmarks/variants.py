"""Decode-kernel variants on one GPU call: correctness at real shapes, then CUDA-graph timings.

``python -m lab.benchmarks.variants OUT_DIR [sweep|bf16|round6|round7]`` (needs CUDA). Each mode first
measures the device-to-device copy bandwidth, runs, writes JSON under ``OUT_DIR`` and prints a
table last:

* (none)  round 4's INT2 tile variants next to SDPA and the BF16 kernel, with oracle checks,
  one prefill chunk and kernel resources (``lab.benchmarks.variants_int2``) → ``variants.json``;
* ``sweep``  the raw INT2 kernel's tile sweep (``variants_int2.sweep``) → ``sweep.json``
  and ``compiled.txt`` (TTGIR, registers, spills);
* ``bf16``   the BF16 kernel's config sweep vs SDPA (``lab.benchmarks.variants_bf16``) →
  ``bf16_sweep.json``;
* ``round6`` round 6's transposed-tile INT2 kernel at several register caps
  (``lab.benchmarks.variants_round6``) → ``round6.json``; ``round7`` round 7's code conversion at several register caps → ``round7.json``.

Anything else after ``OUT_DIR`` runs the default. Times are CUDA-graph replays over enough
rotated caches that the L2 cache (50 MB on an H100) cannot serve them
(``lab.benchmarks.variants_common``). This module is the command line only; the benchmarks live
in the ``variants_*`` modules.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch

from oscarkv.bench.attention import AttentionBench, copy_bandwidth
from lab.benchmarks.variants_bf16 import bf16_sweep, bf16_table
from lab.benchmarks.variants_int2 import (INT2_VARIANTS, POINTS, check, dump_compiled, resources, sweep,
                                         table, time_point, time_prefill)
from lab.benchmarks.variants_round6 import ROUND6, ROUND6_G64, ROUND7, ROUND7_G64, round6, round6_table


def run_sweep(out: Path) -> None:
    cfg = AttentionBench()
    copy_bandwidth(), copy_bandwidth()
    copy = copy_bandwidth()
    rows = sweep(cfg, copy)
    dump_compiled(out)
    (out / "sweep.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbps": copy,
                                               "runs": rows}, indent=1))
    for (ctx, bsz, int2, group), grp in itertools.groupby(rows, lambda r: (r["context"], r["batch"], r["int2"], r["group"])):
        best = sorted(grp, key=lambda r: r["us"])[:4]
        print(ctx, bsz, "int2" if int2 else "bf16", group, [(r["BLOCK_N"], r["num_stages"], r["per_sm"], r["maxnreg"],
                                                            round(r["us"], 1), round(r["pct_copy"])) for r in best])


def run_round6(out: Path, name: str = "round6", variants: dict = ROUND6, g64: tuple[str, ...] = ROUND6_G64) -> None:
    cfg = AttentionBench()
    copy_bandwidth(), copy_bandwidth()
    copy = copy_bandwidth()
    res = round6(cfg, copy, variants, g64) | {"device": torch.cuda.get_device_name(), "copy_gbps": copy}
    (out / f"{name}.json").write_text(json.dumps(res, indent=1))
    print("\n".join(f"{r['kernel']} regs {r['regs']} spills {r['spills']} {r['key'][-90:]}" for r in res["resources"]))
    print(f"copy {copy:.0f} GB/s")
    print(round6_table(res))


def run_bf16(out: Path) -> None:
    cfg = AttentionBench()
    copy_bandwidth(), copy_bandwidth()
    res = bf16_sweep(cfg) | {"device": torch.cuda.get_device_name(), "copy_gbps": copy_bandwidth()}
    (out / "bf16_sweep.json").write_text(json.dumps(res, indent=1))
    print(bf16_table(res))


def run_variants(out: Path) -> None:
    cfg = AttentionBench()
    copy_bandwidth(), copy_bandwidth()
    copy = copy_bandwidth()
    prefill = time_prefill(cfg)
    checks = check(cfg)
    broken = frozenset(n for n in INT2_VARIANTS if not any(c["variant"] == n and c["rel_err"] < 0.05 for c in checks))
    rows = [time_point(cfg, c, b, broken) for c, b in POINTS]
    res = resources()
    (out / "variants.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbps": copy,
                                                   "checks": checks, "prefill": prefill, "rows": rows,
                                                   "resources": res}, indent=1))
    print("\n".join(f"regs {r['regs']} spills {r['spills']} {r['key']}" for r in res))
    print(table(rows, copy))


def run_round7(out: Path) -> None:
    run_round6(out, "round7", ROUND7, ROUND7_G64)


MODES = {"sweep": run_sweep, "round6": run_round6, "round7": run_round7, "bf16": run_bf16}


def main(argv: list[str]) -> None:
    """``argv`` = ``OUT_DIR [MODE]``: exactly one known mode after ``OUT_DIR`` picks it, else the default run."""
    out, rest = Path(argv[0]), argv[1:]
    run = MODES[rest[0]] if len(rest) == 1 and rest[0] in MODES else run_variants
    run(out)


if __name__ == "__main__":
    main(sys.argv[1:])
