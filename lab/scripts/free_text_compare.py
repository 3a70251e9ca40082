"""Paired comparison of ``free_text_quality`` runs (development data; lab code).

Reads the ``free_text_quality.json`` of several runs (the same ``--tokens`` and ``--max-tokens``), keeps one row per
configuration, document and request, and reports per configuration its mean 4-gram repeat share (``loop``), its
outputs at >= 0.5 and, over the requests both answered, its mean difference from each reference configuration with a
95% bootstrap interval (resampling the requests; 4000 draws, seed 0). Writes ``summary.md`` and ``summary.json``.

    python -m lab.scripts.free_text_compare --runs DIR,DIR --refs bf16,shipped --out DIR
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def load(runs: list[Path]) -> dict[str, dict[tuple[str, str], float]]:
    """config -> (document, request) -> loop share."""
    out: dict[str, dict[tuple[str, str], float]] = {}
    for run in runs:
        for r in json.loads((run / "free_text_quality.json").read_text())["rows"]:
            out.setdefault(r["config"], {})[(r["document"], r["task"])] = r["loop"]
    return out


def interval(diffs: list[float], draws: int = 4000) -> tuple[float, float]:
    rng = random.Random(0)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(draws))
    return means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def compare(loops: dict, refs: list[str]) -> list[dict]:
    rows = []
    for name, got in loops.items():
        row = dict(config=name, n=len(got), loop=round(sum(got.values()) / len(got), 3),
                   stuck=sum(v >= 0.5 for v in got.values()))
        for ref in refs:
            keys = sorted(set(got) & set(loops.get(ref, {})))
            if ref != name and keys:
                diffs = [got[k] - loops[ref][k] for k in keys]
                lo, hi = interval(diffs)
                row[f"vs {ref}"] = dict(n=len(keys), diff=round(sum(diffs) / len(diffs), 3), lo=round(lo, 3), hi=round(hi, 3))
        rows.append(row)
    return rows


def table(rows: list[dict], refs: list[str]) -> str:
    lines = ["| configuration | requests | loop | stuck (>= 0.5) | " + " | ".join(f"- {r} (n, 95%)" for r in refs) + " |",
             "|---|---:|---:|---:|" + "---|" * len(refs)]
    for r in rows:
        cells = [f"{c['diff']:+.3f} ({c['n']}, {c['lo']:+.3f} to {c['hi']:+.3f})" if (c := r.get(f"vs {ref}")) else "-"
                 for ref in refs]
        lines.append(f"| {r['config']} | {r['n']} | {r['loop']:.3f} | {r['stuck']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True, help="comma-separated run directories")
    ap.add_argument("--refs", default="bf16,shipped")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    refs = a.refs.split(",")
    rows = compare(load([Path(p) for p in a.runs.split(",")]), refs)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.json").write_text(json.dumps(rows, indent=1))
    (a.out / "summary.md").write_text(table(rows, refs) + "\n")
    print(table(rows, refs))


if __name__ == "__main__":
    main()
