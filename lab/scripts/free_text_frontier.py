"""Free-running text against needles per recipe (development data; lab code): one point per configuration, its
repeated-4-gram excess over the unquantized cache (``free_text_compare``'s ``summary.json``) against its share of
the unquantized cache's development needles at 8K (``oscarkv eval`` ``results.json`` files, configurations named as
there, ``oscar:NAME+win``), coloured by bits per element. Writes ``frontier.png`` and ``frontier.md`` into ``--out``.

    python -m lab.scripts.free_text_frontier --text DIR/summary.json --needles A/results.json,B/results.json --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAMES = {"shipped+sink16": "sink16", "shipped+sink64": "sink64", "int2+win": "int2"}
"""Free-text configuration → the eval's recipe name, where they differ."""


def needles(paths: list[Path]) -> dict[str, tuple[float, float]]:
    """recipe name → (share of the unquantized cache's accuracy, BPE), over every eval run given."""
    out, ref = {}, {}
    for p in paths:
        recs = json.loads(p.read_text())["records"]
        ref = next(r["accuracy"] for r in recs if r["method"] == "bf16")
        for r in recs:
            if r["method"].startswith("oscar:"):
                out[r["method"][6:].removesuffix("+win")] = (r["accuracy"] / ref, r["bpe"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--needles", required=True, help="comma-separated results.json files")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    text = {r["config"]: r["vs bf16"]["diff"] for r in json.loads(a.text.read_text()) if "vs bf16" in r}
    acc = needles([Path(p) for p in a.needles.split(",")])
    rows = [(name, d, *acc[NAMES.get(name, name)]) for name, d in text.items() if NAMES.get(name, name) in acc]
    lines = ["| configuration | repeated 4-grams above unquantized | needles 8K, of unquantized | BPE (8K, served) |",
             "|---|---:|---:|---:|"] + [f"| {n} | {d:+.3f} | {s:.1%} | {b:.2f} |" for n, d, s, b in sorted(rows, key=lambda r: r[1])]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "frontier.md").write_text("\n".join(lines) + "\n")
    plot(rows, a.out / "frontier.png")
    print("\n".join(lines))


def plot(rows: list[tuple[str, float, float, float]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    pts = ax.scatter([r[1] for r in rows], [100 * r[2] for r in rows], c=[r[3] for r in rows], cmap="viridis", s=50)
    for name, d, s, _ in rows:
        ax.annotate(name, (d, 100 * s), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.margins(x=0.15, y=0.08)
    fig.colorbar(pts, label="bits per element (8K, served)")
    ax.set_xlabel("repeated 4-grams above the unquantized cache (development, 4K, 132 requests)")
    ax.set_ylabel("development needles at 8K, % of unquantized")
    ax.set_title("Free-running text against needles, per recipe (SmolLM2-135M, one H200)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
