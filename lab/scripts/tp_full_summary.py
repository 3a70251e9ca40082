"""The short report of ``gpu_tp_full.sh``: per-rank kernel profiles of the decode graphs, TTFT under tp, jobs.

Run: ``python -m lab.scripts.tp_full_summary WORKDIR`` (the script does). Reads the decode JSON (rank 0's
``kernels`` rows) and logs (each worker's JSON line ``{"rank": r, "kernels": [...]}``) of every run with a
profile, ``prefill_tp2.json`` and ``jobs_tp2.json``; prints the top kernels per rank (µs and launches per
graph replay), the TTFT rows (OSCAR / BF16) and the jobs rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TOP = 10


def _kernels(title: str, rank: int, rows: list[dict]) -> list[str]:
    total = sum(r["us"] for r in rows)
    out = [f"{title} rank {rank}: {total / 1e3:.2f} ms of kernels per replay"]
    out += [f"  {r['us']:8.1f} us {r['count']:6.1f}x  {r['name'][:80]}" for r in rows[:TOP]]
    return out


def profiles(work: Path) -> list[str]:
    lines = []
    for js in sorted(work.glob("decode_*.json")):
        for row in json.loads(js.read_text())["rows"]:
            if row.get("kernels"):
                lines += _kernels(f"{js.stem} {row['method']}", 0, row["kernels"])
        log = js.with_suffix(".log")
        for text in log.read_text().splitlines() if log.exists() else []:
            if text.startswith('{"rank"'):
                r = json.loads(text)
                lines += _kernels(js.stem, r["rank"], r["kernels"])
    return lines


def prefill(work: Path) -> list[str]:
    path = work / "prefill_tp2.json"
    if not path.exists():
        return ["prefill: no JSON"]
    rows = [r for r in json.loads(path.read_text())["rows"] if "ttft_s" in r]
    bf16 = {(r["shape"], r["chunk"], r["context"]): r["ttft_s"] for r in rows if r["method"] == "bf16"}
    return [f"TTFT {r['shape']} tp {r.get('tp', 1)} chunk {r['chunk']} ctx {r['context']} {r['method']}: "
            f"{r['ttft_s']:.2f} s, {r['ttft_s'] / bf16[k]:.3f}x BF16, {r['ttft_s'] / r['floor_s']:.2f}x floor"
            for r in rows if (k := (r["shape"], r["chunk"], r["context"])) in bf16]


def jobs(work: Path) -> list[str]:
    path = work / "jobs_tp2.json"
    if not path.exists():
        return ["jobs: no JSON"]
    return ["jobs " + json.dumps({k: v for k, v in r.items() if not isinstance(v, (list, dict))})
            for r in json.loads(path.read_text())["rows"]]


if __name__ == "__main__":
    work = Path(sys.argv[1])
    print("\n".join(profiles(work) + prefill(work) + jobs(work)))
