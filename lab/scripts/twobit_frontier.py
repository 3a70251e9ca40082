"""The two-bit frontier (issue 26): every served point tried, and the per-layer sensitivities behind the recipes.

Reads every ``results.json`` under ``lab/results/gpu_twobit*/``, ``gpu_heads/`` and ``gpu_heads_windows/`` (its evaluation lanes) (``oscarkv eval`` as ``gpu_twobit.sh
eval`` runs it)
and, per context (4K, 8K) and task group (single needle, multi-needle mean), plots each configuration's stored
bits per element (as served) against its share of the unquantized reference on the same samples
(``oscarkv.eval.paired.compare``: haystacks pooled), labelled by what it stores (4-bit-key layers, windows).
Every point of every run is drawn (a configuration measured twice appears twice). The second figure: the
development sensitivities (``twobit_dev.py``'s ``sensitivity.json``: answer-NLL gain ± standard error when one
layer's keys alone are 4-bit) and which layers each recipe raises. Captions carry each run's device, date and
command.

    python lab/scripts/twobit_frontier.py     # lab/results/twobit_frontier.png, lab/results/twobit_sensitivity.png
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

from matplotlib.figure import Figure

from oscarkv.eval import paired
from oscarkv.eval.report import REFERENCES, headline, task_group

COMMAND = "python lab/scripts/twobit_frontier.py"


def label(method: str, kv: dict) -> str:
    """What a configuration stores: ``bf16``, ``INT2``, ``K4V2``, ``K4×N`` (N layers) or ``K4 in N heads``, with its
    windows."""
    if kv["method"] == "bf16":
        return "bf16"
    heads = sum(map(len, kv.get("layer_key_heads") or []))
    if heads:
        return f"K4 in {heads} heads s{kv['sink']}/r{kv['recent']}"
    n = sum(b == 4 for b in kv.get("layer_key_bits") or [])
    nv = sum(b == 4 for b in kv.get("layer_value_bits") or [])
    name = f"K4×{n}" + (f" V4×{nv}" if nv else "") if n else \
        "INT2" if kv["key_bits"] == 2 else f"K{kv['key_bits']}V{kv['value_bits']}"
    return f"{method.removeprefix('oscar:').removesuffix('+win')}: {name} s{kv['sink']}/r{kv['recent']}" \
        if n else f"{name} s{kv['sink']}/r{kv['recent']}"


def points(results: list[Path]) -> tuple[list[dict], list[str]]:
    """(one dict per paired row of every run, caption lines: run, device, date, command)."""
    rows, captions = [], []
    for path in results:
        run = json.loads(path.read_text())
        meta, run_name = run["meta"], f"{path.parent.parent.name}/{path.parent.name}"
        for p in paired.compare(headline(run["records"]), task_group, REFERENCES):
            ref = p.accuracy / p.share if p.share else None  # the reference's accuracy (a fraction)
            rows.append(dict(run=run_name, group=p.group, context=p.context, bpe=p.bpe, samples=p.samples,
                             share=None if p.share is None else 100 * p.share, diff=p.diff, se=p.se,
                             share_se=p.se / ref if ref else None,
                             label=label(p.method, meta["configs"][p.method])))
        captions.append(f"{run_name}: {meta.get('device', '?')}, {meta.get('date', '?')}, `{meta.get('command', '?')}`")
    return rows + UNKEPT, captions + [f"{r['run']}: {r['note']}" for r in UNKEPT]


UNKEPT = [dict(run="gpu_twobit/eval_8192_single", group="single needle", context=8192, bpe=3.07, samples=40,
               share=100 * 52.5 / 85.0, diff=-32.5, se=7.5, share_se=7.5 / 0.85, label="K4×6 s64/r128 (from 4K)",
               note="NVIDIA H100, 2026-11-27, docs/RESULTS.md's table (its results.json was not kept)")]
"""Served points whose results.json is not in the repository, from the table that reported them."""


CHEAPEST = {4096: (4.59, "K4V2+win"), 8192: (5.00, "OSCAR INT4+win")}
"""Today's cheapest configuration keeping 95% per context (docs/RESULTS.md): the bytes to beat."""


def merged(rows: list[dict]) -> list[dict]:
    """One point per (label, bits, share) measured alike in several runs, the runs joined in its ``run``."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["group"], r["context"], r["label"], round(r["bpe"], 2), r["share"])
        if key in out:
            out[key] = {**out[key], "run": out[key]["run"] + ", " + r["run"].split("/")[0]}
        else:
            out[key] = {**r, "run": r["run"].split("/")[0]}
    return list(out.values())


def frontier_plot(rows: list[dict], captions: list[str], path: Path) -> None:
    groups, contexts = paired_groups(rows), sorted({r["context"] for r in rows})
    fig = Figure(figsize=(7 * len(contexts), 4.5 * len(groups) + 0.9), layout="constrained")
    for gi, group in enumerate(groups):
        for ci, ctx in enumerate(contexts):
            ax = fig.add_subplot(len(groups), len(contexts), gi * len(contexts) + ci + 1)
            mine = [r for r in merged(rows) if r["group"] == group and r["context"] == ctx
                    and r["share"] is not None and r["label"] != "bf16"]  # the reference is 100% by definition
            for k, r in enumerate(sorted(mine, key=lambda r: (r["bpe"], r["share"]))):
                color = "C0" if r["label"].startswith("INT2") else "C2" if r["label"].startswith("K4V2") else "C3"
                ax.errorbar(r["bpe"], r["share"], yerr=r["share_se"] or 0, fmt="o", color=color, capsize=2)
                ax.annotate(f"{r['label']} [{r['run']}]", (r["bpe"], r["share"]), textcoords="offset points",
                            xytext=(5, -10 + 9 * (k % 3)), fontsize="xx-small")
            ax.axhline(95, color="grey", linestyle="--", linewidth=1)
            if ctx in CHEAPEST:
                ax.axvline(CHEAPEST[ctx][0], color="grey", linestyle=":", linewidth=1)
                ax.text(CHEAPEST[ctx][0], 5, f" {CHEAPEST[ctx][1]} ({CHEAPEST[ctx][0]})", fontsize="xx-small")
            if not mine:
                ax.text(3.5, 50, "not measured", ha="center")
            ax.set_xlim(2.8, 5.4)
            ax.set_ylim(-5, 110)
            ax.set_xlabel("bits per KV element stored (served)")
            ax.set_ylabel("% of the unquantized reference (paired)")
            ax.set_title(f"{group}, context {ctx} (40 samples a cell, 120 for multi)", fontsize="small")
            ax.grid(alpha=0.3)
    fig.suptitle("two-bit frontier: SmolLM2-135M, free-running through the engine, haystacks eval + gazetteer, "
                 "seed 0; dashed: 95%; dotted: today's cheapest at 95%", fontsize="small")
    wrapped = [textwrap.fill(c, 230) for c in captions] + [f"plot: {COMMAND}"]
    fig.text(0.0, 0.0, "\n".join(wrapped), fontsize=5, va="top", ha="left")
    fig.savefig(path, dpi=120, bbox_inches="tight")


def paired_groups(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["group"] for r in sorted(rows, key=lambda r: r["group"] != "single needle")))


def sensitivity_plot(sens: dict[str, list[dict]], recipes: list[Path], path: Path) -> None:
    fig = Figure(figsize=(11, 3.2 * len(sens) + 0.3 * len(recipes) + 1.2), layout="constrained")
    axes = fig.subplots(len(sens) + 1, 1, squeeze=False)[:, 0]
    for ax, (name, rows) in zip(axes, sens.items()):
        ax.bar([r["layer"] for r in rows], [r["gain"] for r in rows], yerr=[r["stderr"] for r in rows], capsize=2)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_ylabel("answer-NLL gain (nats)")
        ax.set_title(f"{name}: gain when one layer's keys alone are 4-bit (INT2 elsewhere), ± standard error",
                     fontsize="small")
    ax = axes[-1]
    for i, f in enumerate(recipes):
        rec = json.loads(f.read_text())
        bits, heads = rec.get("layer_key_bits") or [], rec.get("layer_key_heads") or []
        ax.scatter([j for j, b in enumerate(bits) if b == 4], [i] * bits.count(4), marker="s", color="C3")
        xs = [j + 0.25 * (h - 1) for j, hs in enumerate(heads) for h in hs]  # a KV head: offset within its layer
        ax.scatter(xs, [i] * len(xs), marker="^", s=12, color="C2")
    ax.set_yticks(range(len(recipes)), [f.stem.removeprefix("twobit_recipe_") for f in recipes], fontsize="x-small")
    ax.set_xlabel("decoder layer")
    ax.set_title("4-bit keys per recipe: layers (squares), KV heads (triangles, offset by head)", fontsize="small")
    fig.suptitle(f"SmolLM2-135M development sensitivities (2-core CPU, teacher-forced, calibration haystack)\n"
                 f"plot: {COMMAND}", fontsize="x-small")
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=Path("lab/results"), help="folder holding gpu_twobit*/")
    p.add_argument("--sensitivity", action="append", default=None, metavar="NAME=FILE",
                   help="sensitivity.json files (default: 8K development, lab/results/dev_twobit_8k)")
    p.add_argument("--out", type=Path, default=Path("lab/results"))
    a = p.parse_args()
    results = sorted([*a.results.glob("gpu_twobit*/eval_*/results.json"), *a.results.glob("gpu_heads/*/eval_*/results.json"),
                      *a.results.glob("gpu_heads_windows/[em]*/eval_*/results.json")])  # not d8*: development
    rows, captions = points(results)
    frontier_plot(rows, captions, a.out / "twobit_frontier.png")
    (a.out / "twobit_frontier.json").write_text(json.dumps({"command": COMMAND, "runs": captions, "points": rows}, indent=1))
    for r in sorted(rows, key=lambda r: (r["context"], r["group"], r["bpe"])):
        share = "—" if r["share"] is None else f"{r['share']:.1f}%"
        print(f"{r['context']:>5} {r['group']:<18} {r['bpe']:5.2f} BPE {share:>7} ({r['diff']:+.1f} ± {r['se']:.1f})  "
              f"{r['label']}  [{r['run']}]")
    specs = a.sensitivity or ["8K development (6 samples, seeds 1000/1001)=lab/results/dev_twobit_8k/sensitivity.json"]
    sens = {s.rpartition("=")[0]: json.loads(Path(s.rpartition("=")[2]).read_text()) for s in specs}
    sensitivity_plot(sens, sorted(Path("lab/scripts").glob("twobit_recipe_*.json")), a.out / "twobit_sensitivity.png")
    print(f"wrote {a.out / 'twobit_frontier.png'}, {a.out / 'twobit_sensitivity.png'}, {a.out / 'twobit_frontier.json'}")


if __name__ == "__main__":
    main()
