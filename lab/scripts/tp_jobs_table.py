"""The whole-jobs rows of ``gpu_tp_table.sh f`` (``bench jobs``, one method a file) as one table: seconds to the
first token, prefill, decode and the whole job per tensor-parallel size and KV method.

    python -m lab.scripts.tp_jobs_table JOBS.json ...
"""

import json
import sys


def rows(paths: list[str]) -> list[dict]:
    out = []
    for path in paths:
        d = json.load(open(path))
        for r in d["rows"]:
            run = r["run"]
            out.append(dict(tp=d["config"]["tensor_parallel_size"], method=r["method"], chunk=r["chunk"],
                            concurrency=r["concurrency"], ttft_s=r["ttft_s"], prefill_s=run["prefill_s"],
                            decode_s=run["decode_s"], total_s=run["total_s"], step_ms=run["decode_step_ms"]))
    return sorted(out, key=lambda r: (r["tp"], r["method"]))


def main(paths: list[str]) -> None:
    print("| GPUs | kv | chunk | at once | TTFT s | prefill s | decode s | job s | decode ms a step (batch) |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows(paths):
        steps = ", ".join(f"{v:.2f} ({b})" for b, v in r["step_ms"].items())
        print(f"| {r['tp']} | {r['method']} | {r['chunk']} | {r['concurrency']} | {r['ttft_s']:.2f} | "
              f"{r['prefill_s']:.2f} | {r['decode_s']:.2f} | {r['total_s']:.2f} | {steps} |")


if __name__ == "__main__":
    main(sys.argv[1:])
