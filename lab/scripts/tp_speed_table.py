"""One table from ``oscarkv bench decode`` JSON files at several tensor-parallel sizes and all-reduces.

Run: ``python -m lab.scripts.tp_speed_table OUT.json DECODE.json ...`` (``gpu_tp_speed.sh`` does): per
row tp, all-reduce, method, ms/step, the graph replay of every rank (ms), the floor (ms), step/floor,
graph/floor and OSCAR/BF16 (the BF16 step of the same shape, context, tp and all-reduce, from any of the
files: a symmetric-memory engine runs one method per process); written to ``OUT.json`` too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows_of(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    tp_default = data["config"].get("tensor_parallel_size", 1)
    return [dict(file=path.name, device=data.get("device"), shape=r["shape"], context=r["context"],
                 tp=r.get("tp", tp_default), all_reduce=r.get("all_reduce") or "-", method=r["method"],
                 step_ms=r["step_us"] / 1e3, graph_ms=(r.get("graph_us") or 0) / 1e3, floor_ms=r["floor_us"] / 1e3,
                 step_over_floor=r["step_us"] / r["floor_us"], graph_over_floor=(r.get("graph_us") or 0) / r["floor_us"])
            for r in data["rows"]]


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row with ``over_bf16``: the BF16 step of its shape, context, tp and all-reduce over its own."""
    key = lambda r: (r["shape"], r["context"], r["tp"], r["all_reduce"])  # noqa: E731
    bf16 = {key(r): r["step_ms"] for r in rows if r["method"] == "bf16"}
    return [r | dict(over_bf16=bf16[key(r)] / r["step_ms"] if key(r) in bf16 else None) for r in rows]


def main() -> None:
    out, paths = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:] if Path(p).exists()]
    rows = with_ratios([r for p in paths for r in rows_of(p)])
    print("| model | tp | all-reduce | kv | ms/step | graph ms | floor ms | step/floor | graph/floor | OSCAR/BF16 |\n"
          "|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['over_bf16']:.2f}x" if r["method"] != "bf16" and r["over_bf16"] else ""
        print(f"| {r['shape']} | {r['tp']} | {r['all_reduce']} | {r['method']} | {r['step_ms']:.2f} | {r['graph_ms']:.2f} | "
              f"{r['floor_ms']:.2f} | {r['step_over_floor']:.2f} | {r['graph_over_floor']:.2f} | {ratio} |")
    out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
