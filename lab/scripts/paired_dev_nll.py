"""Paired comparison of two artifacts on the same development samples, from their recipe-search logs.

Input: two ``dev_samples.jsonl`` files written by ``oscarkv calibrate --rotations ... --max-bpe ...``
(one line per development sample, the same samples in the same order) and the candidate label to
compare (e.g. ``oscar s=64 r=256``). Output: each file's mean answer NLL and development accuracy
for that candidate and for ``bf16``, and the paired per-sample NLL difference B − A with its
standard error (sample standard deviation / √n).

    python lab/scripts/paired_dev_nll.py runs/dev_a/dev_samples.jsonl runs/dev_b/dev_samples.jsonl --config "oscar s=64 r=256"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean

from oscarkv.eval.paired import difference


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="dev_samples.jsonl of artifact A")
    p.add_argument("b", type=Path, help="dev_samples.jsonl of artifact B (the same samples)")
    p.add_argument("--config", default="oscar s=64 r=256", help="candidate label to compare")
    args = p.parse_args()
    a, b = read(args.a), read(args.b)
    n = min(len(a), len(b))
    if n < 2 or any(x["seed"] != y["seed"] for x, y in zip(a[:n], b[:n])):
        raise SystemExit(f"need >= 2 paired samples with matching seeds; got {len(a)} and {len(b)}")
    if abs(a[0]["nll"]["bf16"] - b[0]["nll"]["bf16"]) > 1e-6:
        raise SystemExit("the two logs' unquantized NLL differ on the first sample: not the same samples")
    for name, rows in (("A", a[:n]), ("B", b[:n])):
        for label in ("bf16", args.config):
            print(f"{name} {label:>18s}: NLL {mean(r['nll'][label] for r in rows):.3f}, "
                  f"accuracy {mean(r['accuracy'][label] for r in rows):.1%}")
    nll = difference(*([r["nll"][args.config] for r in rows[:n]] for rows in (b, a)))
    acc = difference(*([r["accuracy"][args.config] for r in rows[:n]] for rows in (b, a)))
    print(f"B - A NLL: {nll[0]:+.4f} ± {nll[1]:.4f} nats; accuracy {acc[0]:+.1%} ± {acc[1]:.1%} (n = {n})")


if __name__ == "__main__":
    main()
