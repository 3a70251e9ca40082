"""Turn evaluation records into ``results.json``, ``results.md`` and plots.

Input: the records of ``oscarkv.eval.runner`` — one dict per (method, task, context, haystack,
protocol) with ``method`` (a KV label such as ``oscar`` or ``oscar+win``), ``task``,
``context``, ``haystack``, ``protocol`` (``free``, ``forced`` or ``faithful``; records without
one count as ``forced`` on ``eval``), ``samples``, ``bpe`` (bits per KV element stored), either
``accuracy`` (0..1) or ``perplexity``, and optionally ``window`` / ``history`` sub-records (the
samples whose needles lay in the BF16 window or in low-bit history); other keys are carried
into the JSON — plus a ``meta`` dict describing the run. Output, in ``out_dir``:

* ``results.json`` — ``{"meta": meta, "records": records}``, the source of truth;
* ``results.md`` — per protocol and haystack, accuracy per method × task for each context (with
  its BPE and the mean over tasks) and a summary per method × context; free-running beside
  teacher-forced per method; each configuration against the reference on the same samples
  (``oscarkv.eval.paired``: haystacks pooled, share kept, paired difference, the cheapest holding
  95%); needles in the window apart from those in history; perplexity;
* ``accuracy.png`` — mean accuracy over tasks and haystacks against context (the headline
  protocol: free-running where measured), one line per method, the
  unquantized one dashed;
  ``pareto.png`` — accuracy against bits per element, one panel per context and task group
  (the single needle, the mean of the multi-needle tasks);
  ``perplexity.png`` likewise when there are perplexity records.

Plots use matplotlib's object API (``Figure`` renders with Agg), so no global backend is set.
"""

from __future__ import annotations

import json
import pathlib
from collections import defaultdict
from statistics import mean

from oscarkv.config import ENGINE_METHODS
from oscarkv.eval import paired

REFERENCES = ("bf16", "fp16", "fp32")
"""Labels of the unquantized method (its cache's dtype, ``oscarkv.eval.runner.baseline_label``),
drawn dashed / in black as the full-precision reference."""


def write_report(records: list[dict], out_dir: pathlib.Path, meta: dict) -> None:
    """Write ``results.json``, ``results.md`` and the plots into ``out_dir`` (created if needed)."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "records": records}
    (out_dir / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    acc = [r for r in records if "accuracy" in r]
    ppl = [r for r in records if "perplexity" in r]
    (out_dir / "results.md").write_text(markdown(acc, ppl, meta))
    title = plot_title(meta)
    if acc:
        head = headline(acc)
        label = f"mean accuracy over tasks ({_protocol(head[0])})"
        _plot(_by_method_context(head, "accuracy"), label, title, out_dir / "accuracy.png", percent=True)
        pareto_plot(acc, out_dir / "pareto.png", title)
    if ppl:
        _plot(_by_method_context(ppl, "perplexity"), "perplexity", title, out_dir / "perplexity.png")


# ------------------------------------------------------------------------------- tables
def plot_title(meta: dict) -> str:
    """Every plot's title: the model, then where, when and how it was measured (``device``, ``date``,
    ``command`` of the run's meta, where recorded), so a plot read on its own says how to reproduce it."""
    model = pathlib.Path(str(meta.get("model", ""))).name
    where = " · ".join(str(meta[k]) for k in ("device", "date", "command") if meta.get(k))
    return f"{model}\n{where}" if where else model


def markdown(acc: list[dict], ppl: list[dict], meta: dict) -> str:
    """The whole ``results.md`` text."""
    parts = ["# oscarkv evaluation", "", *_meta_lines(meta), ""]
    for (protocol, haystack), rows in _sections(acc).items():
        parts += [f"## Accuracy (%): {PROTOCOL_NAMES.get(protocol, protocol)}, haystack {haystack}", "",
                  *_summary_table(rows), ""]
        for ctx in sorted({r["context"] for r in rows}):
            ctx_rows = [r for r in rows if r["context"] == ctx]
            parts += [f"### Context {ctx}", "", _samples(ctx_rows), "", *_context_table(ctx_rows), ""]
    top = headline(acc)
    if rows := paired.table(paired.compare(top, task_group, REFERENCES)):
        parts += [f"## Against the reference on the same samples, haystacks pooled ({_protocol(top[0])})", "",
                  f"Share of the reference's accuracy and the paired difference (± its standard error); in bold, the "
                  f"configuration of fewest bits keeping ≥ {paired.HOLD:.0%} of the reference per task group and context.", "",
                  *rows, ""]
    if len({_protocol(r) for r in acc}) > 1:
        parts += ["## Free-running vs teacher-forced (%, mean over tasks)", "", *_protocol_table(acc), ""]
    if any("window" in r or "history" in r for r in acc):
        parts += ["## Needles in low-bit history vs in the BF16 window (%, mean over tasks)", "",
                  *_place_table(acc), ""]
    if ppl:
        parts += ["## Perplexity (decode-faithful)", "", _samples(ppl), "", *_ppl_table(ppl), ""]
    if not acc and not ppl:
        parts += ["No records.", ""]
    return "\n".join(parts)


PROTOCOL_NAMES = {"free": "free-running through the engine (as served)",
                  "forced": "teacher-forced single chunk (diagnostic)"}
"""Section titles per protocol."""


def _protocol(r: dict) -> str:
    return r.get("protocol", "forced")


def _sections(acc: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Records by (protocol, haystack): free-running first."""
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in sorted(acc, key=lambda r: _protocol(r) != "free"):
        out[(_protocol(r), r.get("haystack", "eval"))].append(r)
    return out


def headline(acc: list[dict]) -> list[dict]:
    """The records of the headline protocol: free-running where measured, else teacher-forced."""
    free = [r for r in acc if _protocol(r) == "free"]
    return free or acc


def _cell_mean(rows: list[dict], key: str = "accuracy") -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return mean(vals) if vals else None


def _protocol_table(acc: list[dict]) -> list[str]:
    """Per method, each (haystack, context): free-running / teacher-forced."""
    cols = sorted({(r.get("haystack", "eval"), r["context"]) for r in acc})
    lines = _header(["method", *(f"{h} {c}: free / forced" for h, c in cols), "BPE (free)"])
    for m in _methods(acc):
        cells = []
        for h, c in cols:
            mine = [r for r in acc if r["method"] == m and r.get("haystack", "eval") == h and r["context"] == c]
            free = _cell_mean([r for r in mine if _protocol(r) == "free"])
            forced = _cell_mean([r for r in mine if _protocol(r) == "forced"])
            cells.append(f"{_unserved(m) if free is None else _pct(free)} / {_pct(forced)}")
        lines.append(_row([m, *cells, _bpe([r for r in acc if r["method"] == m and _protocol(r) == "free"])]))
    return lines


def _unserved(label: str) -> str:
    """Why a configuration has no free-running figure: the engine cannot serve it, or it was not run."""
    method = label.split("+")[0].split(":")[0]
    ok = method in REFERENCES or (method in ENGINE_METHODS and label.endswith("+win"))
    return "not run" if ok else "not served"


def _place_table(acc: list[dict]) -> list[str]:
    """Per protocol and method, each (haystack, context): history % (n) · window % (n)."""
    cols = sorted({(r.get("haystack", "eval"), r["context"]) for r in acc})
    lines = _header(["protocol", "method", *(f"{h} {c}: history · window" for h, c in cols)])
    for protocol in dict.fromkeys(_protocol(r) for r in sorted(acc, key=lambda r: _protocol(r) != "free")):
        for m in _methods([r for r in acc if _protocol(r) == protocol]):
            cells = []
            for h, c in cols:
                mine = [r for r in acc if (r["method"], _protocol(r), r.get("haystack", "eval"), r["context"])
                        == (m, protocol, h, c)]
                cells.append(" · ".join(_place_cell(mine, p) for p in ("history", "window")))
            lines.append(_row([protocol, m, *cells]))
    return lines


def _place_cell(rows: list[dict], place: str) -> str:
    subs = [r[place] for r in rows if place in r]
    n = sum(s["samples"] for s in subs)
    return f"{_pct(sum(s['accuracy'] * s['samples'] for s in subs) / n)} ({n})" if n else "– (0)"


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
        ref = method in REFERENCES
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
    colors = ["black" if m in REFERENCES else f"C{i % 10}" for i, m in enumerate(methods)]
    ax.barh(methods, values, color=colors)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.3g}", va="center", fontsize="small")
    ax.grid(axis="x", alpha=0.3)


TASK_GROUPS = ("single needle", "multi-needle mean", "other tasks")


def task_group(task: str) -> str:
    """The Pareto plot's rows (``TASK_GROUPS``): the single needle apart from the mean of the multi-needle tasks."""
    return TASK_GROUPS[0] if task == "niah_single" else TASK_GROUPS[1] if task.startswith("niah_multi") else TASK_GROUPS[2]


def pareto_plot(acc: list[dict], path: pathlib.Path, title: str) -> None:
    """Accuracy (mean over the tasks of a :func:`task_group` and over haystacks) against bits per
    element, one point per method, one panel per task group (rows) and context (columns):
    free-running figures where measured (filled), teacher-forced ones for the configurations
    without (hollow, labelled "tf"); the unquantized cache as a dashed line, the upper-left
    frontier of the filled points in grey."""
    from matplotlib.figure import Figure

    contexts = sorted({r["context"] for r in acc})
    groups = [g for g in TASK_GROUPS if any(task_group(r["task"]) == g for r in acc)]
    fig = Figure(figsize=(5.0 * len(contexts), 4.2 * len(groups)), layout="constrained")
    for (g, group), (i, ctx) in ((a, b) for a in enumerate(groups) for b in enumerate(contexts)):
        pts = _pareto_points([r for r in acc if r["context"] == ctx and task_group(r["task"]) == group])
        if not pts:
            continue  # not measured: the panel stays blank
        ax = fig.add_subplot(len(groups), len(contexts), g * len(contexts) + i + 1)
        for x, y, m, free in pts:
            if m in REFERENCES:
                ax.axhline(y, color="black", linestyle="--", linewidth=1)
            color = "black" if m in REFERENCES else ("C0" if free else "C1")
            ax.scatter([x], [y], color=color if free else "none", edgecolors=color, zorder=3)
            ax.annotate(m + ("" if free else " (tf)"), (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize="x-small")
        front, best = [], -1.0
        for x, y, _, _ in sorted(p for p in pts if p[3]):
            if y > best:
                front.append((x, y))
                best = y
        if front:
            ax.plot(*zip(*front), color="grey", alpha=0.5, drawstyle="steps-post")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bits per KV element stored")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(-2, 102)
        ax.set_title(f"{group}, context {ctx}: filled free-running, hollow teacher-forced (tf)", fontsize="small")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize="medium")
    fig.savefig(path, dpi=120)


def _pareto_points(rows: list[dict]) -> list[tuple[float, float, str, bool]]:
    """(BPE, accuracy %, method, free-running?) per method with any rows: free-running where measured."""
    pts = []
    for m in _methods(rows):
        mine = [r for r in rows if r["method"] == m]
        free = [r for r in mine if _protocol(r) == "free"]
        use = free or mine
        pts.append((mean(r["bpe"] for r in use), 100 * mean(r["accuracy"] for r in use), m, bool(free)))
    return pts
