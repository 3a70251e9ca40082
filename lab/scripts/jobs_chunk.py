"""``bench jobs`` with OSCAR's prefill in chunks of BF16's size (8192 tokens; the bench's 2048 fits its 26-sequence
default, where few sequences run at once it only adds steps): whole jobs as ``gpu_tp_table.sh f`` runs them.

    python -m lab.scripts.jobs_chunk --tp 4 --chunk 8192 --out JOBS.json
"""

import argparse
from pathlib import Path

from oscarkv.bench import jobs
from oscarkv.bench.configs import JobsBench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--method", default="oscar")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    cfg = JobsBench(shape="qwen3-8b", kv_gib=24.0, requests=4, new_tokens=(256,), methods=(a.method,),
                    tensor_parallel_size=a.tp, chunks=(("bf16", 8192), ("naive", 2048), (a.method, a.chunk)))
    print(jobs.run(cfg, a.out))


if __name__ == "__main__":
    main()
