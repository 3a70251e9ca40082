"""Turn evaluation records into ``results.json``, ``results.md`` and plots.

Input: the records of ``oscarkv.eval.runner`` — one dict per (method, task, context) with
``method`` (a KV label such as ``oscar`` or ``oscar+win``), ``task``, ``context``,
``samples``, ``bpe`` (bits per KV element stored) and either ``accuracy`` (0..1) or
``perplexity``; other keys are carried into the JSON and otherwise ignored — plus a ``meta``
dict describing the run. Output, in ``out_dir``:

* ``results.json`` — ``{"meta": meta, "records": records}``, the source of truth;
* ``results.md`` — accuracy per method × task for each context (with its BPE and the mean
  over tasks), a summary per method × context, and perplexity per method × context;
* ``accuracy.png`` — mean accuracy over tasks against context, one line per method, BF16
  dashed; ``perplexity.png`` likewise when there are perplexity records.

Plots use matplotlib's object API (``Figure`` renders with Agg), so no global backend is set.
"""

from __future__ import annotations

import json
import pathlib
from collections import defaultdict
from statistics import mean

REFERENCE = "bf16"
"""The method drawn dashed as the full-precision reference."""


def write_report(records: list[dict], out_dir: pathlib.Path, meta: dict) -> None:
    """Write ``results.json``, ``results.md`` and the plots into ``out_dir`` (created if needed)."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "records": records}
    (out_dir / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    acc = [r for r in records if "accuracy" in r]
    ppl = [r for r in records if "perplexity" in r]
    (out_dir / "results.md").write_text(markdown(acc, ppl, meta))
    title = pathlib.Path(str(meta.get("model", ""))).name
    if acc:
        _plot(_by_method_context(acc, "accuracy"), "mean accuracy over tasks", title, out_dir / "accuracy.png",
              percent=True)
    if ppl:
        _plot(_by_method_context(ppl, "perplexity"), "perplexity", title, out_dir / "perplexity.png")


# ------------------------------------------------------------------------------- tables
def markdown(acc: list[dict], ppl: list[dict], meta: dict) -> str:
    """The whole ``results.md`` text."""
    parts = ["# oscarkv evaluation", "", *_meta_lines(meta), ""]
    if acc:
        parts += ["## Accuracy (%)", "", *_summary_table(acc), ""]
        for ctx in sorted({r["context"] for r in acc}):
            rows = [r for r in acc if r["context"] == ctx]
            parts += [f"### Context {ctx}", "", _samples(rows), "", *_context_table(rows), ""]
    if ppl:
        parts += ["## Perplexity (decode-faithful)", "", _samples(ppl), "", *_ppl_table(ppl), ""]
    if not acc and not ppl:
        parts += ["No records.", ""]
    return "\n".join(parts)


def _meta_lines(meta: dict) -> list[str]:
    """Scalar meta fields as bullets; nested ones stay in results.json."""
    lines = []
    for key, value in meta.items():
        if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
            value = ", ".join(map(str, value))
        if isinstance(value, (str, int, float, bool)) or value is None:
            lines.append(f"- {key}: {value}")
    return lines + ["- full configuration and every record: results.json"]


def _samples(rows: list[dict]) -> str:
    counts = sorted({r.get("samples") for r in rows if r.get("samples") is not None})
    return f"Samples per cell: {', '.join(map(str, counts)) or 'not recorded'}."


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _header(cells) -> list[str]:
    return [_row(cells), _row(["---"] * len(cells))]


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _bpe(rows: list[dict]) -> str:
    vals = [r["bpe"] for r in rows if r.get("bpe") is not None]
    return f"{mean(vals):.2f}" if vals else "–"


def _methods(records: list[dict]) -> list[str]:
    """Methods in order of first appearance (the runner lists BF16 first)."""
    return list(dict.fromkeys(r["method"] for r in records))


def _context_table(rows: list[dict]) -> list[str]:
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    cell = {(r["method"], r["task"]): r["accuracy"] for r in rows}
    lines = _header(["method", *tasks, "avg", "BPE", "KV MiB", "answer NLL"])
    for m in _methods(rows):
        vals = [cell.get((m, t)) for t in tasks]
        present = [v for v in vals if v is not None]
        avg = mean(present) if present else None
        mine = [r for r in rows if r["method"] == m]
        lines.append(_row([m, *map(_pct, vals), _pct(avg), _bpe(mine), _mib(mine), _nll(mine)]))
    return lines


def _nll(rows: list[dict]) -> str:
    """Mean negative log-likelihood of the answer tokens (nats; lower is better), over tasks."""
    vals = [r["answer_nll"] for r in rows if r.get("answer_nll") is not None]
    return f"{mean(vals):.3f}" if vals else "–"


def _mib(rows: list[dict]) -> str:
    """Mean KV bytes held per sample (document, question and answer), in MiB."""
    vals = [r["kv_bytes"] for r in rows if r.get("kv_bytes")]
    return f"{mean(vals) / 2**20:.2f}" if vals else "–"


def _summary_table(acc: list[dict]) -> list[str]:
    grid = _by_method_context(acc, "accuracy")
    contexts = sorted({r["context"] for r in acc})
    lines = _header(["method", *(f"{c}" for c in contexts), "avg", "BPE"])
    for m in _methods(acc):
        vals = [grid[m].get(c) for c in contexts]
        present = [v for v in vals if v is not None]
        avg = mean(present) if present else None
        lines.append(_row([m, *map(_pct, vals), _pct(avg), _bpe([r for r in acc if r["method"] == m])]))
    return ["Mean over tasks, per context (tokens):", "", *lines]


def _ppl_table(ppl: list[dict]) -> list[str]:
    grid = _by_method_context(ppl, "perplexity")
    contexts = sorted({r["context"] for r in ppl})
    lines = _header(["method", *(f"{c}" for c in contexts), "BPE"])
    for m in _methods(ppl):
        vals = ["–" if grid[m].get(c) is None else f"{grid[m][c]:.3f}" for c in contexts]
        lines.append(_row([m, *vals, _bpe([r for r in ppl if r["method"] == m])]))
    return lines


def _by_method_context(records: list[dict], metric: str) -> dict[str, dict[int, float]]:
    """``{method: {context: mean of metric over tasks}}``."""
    cells: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        cells[r["method"]][r["context"]].append(r[metric])
    return {m: {c: mean(v) for c, v in sorted(by_ctx.items())} for m, by_ctx in cells.items()}


# ------------------------------------------------------------------------------- plots
def _plot(grid: dict[str, dict[int, float]], ylabel: str, title: str, path: pathlib.Path,
          percent: bool = False) -> None:
    """One line per method against context (log2 axis), or one bar per method when a single
    context was run (points at one x would hide each other); accuracy is drawn in percent."""
    from matplotlib.figure import Figure  # optional dependency (the "eval" extra)

    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    scale = 100.0 if percent else 1.0
    contexts = sorted({c for by_ctx in grid.values() for c in by_ctx})
    if len(contexts) == 1:
        _bars(ax, grid, contexts[0], scale)
        ax.set_xlabel(ylabel + (" (%)" if percent else "") + f", context {contexts[0]} tokens")
        ax.set_title(title, fontsize="medium")
        fig.savefig(path, dpi=120)
        return
    for method, by_ctx in grid.items():
        xs = list(by_ctx)
        ys = [scale * by_ctx[x] for x in xs]
        ref = method == REFERENCE
        ax.plot(xs, ys, linestyle="--" if ref else "-", marker=None if ref else "o",
                color="black" if ref else None, label=method)
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel(ylabel + (" (%)" if percent else ""))
    if percent:
        ax.set_ylim(-2, 102)
    ax.set_title(title, fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)


def _bars(ax, grid: dict[str, dict[int, float]], context: int, scale: float) -> None:
    """Horizontal bars, one per method in report order, the reference in black, values labelled."""
    methods = list(grid)[::-1]  # first method on top
    values = [scale * grid[m][context] for m in methods]
    colors = ["black" if m == REFERENCE else f"C{i % 10}" for i, m in enumerate(methods)]
    ax.barh(methods, values, color=colors)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.3g}", va="center", fontsize="small")
    ax.grid(axis="x", alpha=0.3)
