"""Per-head 4-bit keys against the BF16 windows at 8K (issue 26, development only): within INT2's bytes, do more heads
of 4-bit keys beat the sink and recent window they displace?

Configurations (each at most the uniform INT2 recipe's bits per element at 8192 tokens by the codec, 3.0273): the
shipped 28 heads with sink 64 / recent 64; 38 heads with sink 64 and no recent window; 38 heads with recent 64 and
no sink; 47 heads with neither; 38 heads with pages of 32, sink 32 and recent 32. Heads ranked as the shipped recipe
ranks them (``twobit_head_recipe.py``). Scored on development samples (calibration haystack) with the recipe search's objective, ``--protocol forced`` (teacher-forced
answer NLL) or ``served`` (the engine's chunked prefill, free-running), paired against the shipped recipe.

    OMP_NUM_THREADS=1 python lab/scripts/twobit_head_windows.py --seeds 1006 --samples 6 --out DIR &
    OMP_NUM_THREADS=1 python lab/scripts/twobit_head_windows.py --seeds 1007 --samples 6 --out DIR &
    wait; python lab/scripts/twobit_head_windows.py --combine --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lab.scripts.twobit_artifacts import SHIPPED  # noqa: E402
from lab.scripts.twobit_heads import logged_scores, ranked_heads  # noqa: E402
from oscarkv.calibrate.default import frontier_artifacts  # noqa: E402
from oscarkv.cli.flags import load  # noqa: E402
from oscarkv.config import KVConfig  # noqa: E402
from oscarkv.eval.paired import difference  # noqa: E402
from oscarkv.quant.artifact import Artifact, apply_recipe  # noqa: E402
from oscarkv.quant.codec import build_codec  # noqa: E402

CONFIGS = {"28 heads s64/r64": (28, 64, 64, 64), "38 heads s64/r0": (38, 64, 0, 64), "38 heads s0/r64": (38, 0, 64, 64),
           "47 heads s0/r0": (47, 0, 0, 64), "38 heads s32/r32 p32": (38, 32, 32, 32)}
"""label: (4-bit key heads, sink, recent, page size); the served protocol leaves out what the engine cannot serve (no
recent window; a sink of part of a page)."""


def configs(art: Artifact) -> dict:
    base = apply_recipe(KVConfig(group_size=art.manifest["group_size"]), art)
    ranked = ranked_heads()
    out = {}
    for label, (n, sink, recent, page) in CONFIGS.items():
        heads = tuple(tuple(sorted(h for li, h in ranked[:n] if li == i)) for i in range(art.fingerprint.num_layers))
        out[label] = build_codec(replace(base, sink=sink, recent=recent, page_size=page, layer_key_heads=heads),
                                 *art.fingerprint.kv_dims, art)
    return out


def combine(out: Path) -> None:
    rows = [json.loads(line) for f in sorted(out.glob("scores_*.jsonl")) for line in f.read_text().splitlines()]
    base = [r["nll"]["28 heads s64/r64"] for r in rows]
    summary = {}
    for label in [k for k in CONFIGS if k in rows[0]["nll"]]:
        mine = [r["nll"][label] for r in rows]
        d, se = difference(mine, base)
        summary[label] = {"nll": sum(mine) / len(mine), "accuracy": sum(r["accuracy"][label] for r in rows) / len(rows),
                          "vs_shipped": d, "stderr": se, "bpe_8k": rows[0]["bpe"][label], "samples": len(rows)}
        print(f"{label:<18} BPE {rows[0]['bpe'][label]:.4f}  NLL {summary[label]['nll']:.3f}  "
              f"found {100 * summary[label]['accuracy']:.0f}%  vs shipped {d:+.3f} ± {se:.3f}  ({len(rows)} samples)")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1006")
    p.add_argument("--samples", type=int, default=6)
    p.add_argument("--protocol", choices=("forced", "served"), default="forced")
    p.add_argument("--combine", action="store_true")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.combine:
        return combine(a.out)
    loaded = load("default", "float32", "cpu")
    art = frontier_artifacts(Artifact.load(SHIPPED))["int2"]
    codecs = configs(art)
    seeds = tuple(int(x) for x in a.seeds.split(","))
    logged_scores(loaded, codecs, seeds, a.samples, a.out / f"scores_{a.seeds.replace(',', '_')}.jsonl",
                  extra={"bpe": {k: round(c.bpe(8192), 4) for k, c in codecs.items()}}, protocol=a.protocol,
                  artifacts={k: art for k in codecs} if a.protocol == "served" else None)

if __name__ == "__main__":
    main()
