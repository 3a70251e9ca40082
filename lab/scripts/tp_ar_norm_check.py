"""The fused one-shot all-reduce + residual + RMSNorm on real GPUs (issue 27; ``oscarkv.kernels.allreduce_norm``):
correct under concurrency, and faster than what the engine runs today?

Run: ``python -m lab.scripts.tp_ar_norm_check --out DIR`` (every visible GPU, one process each; ``--ranks N``).

For rows 1, 8 and 64 and D 4096 / 5120 (Qwen3-8B / -32B): every rank draws every rank's partial from its seed, so each
checks (a) the fused result against the exact sum (fp32) → bf16 → residual → RMSNorm computed locally, (b) that every
rank holds the same bits (gathered to rank 0), (c) after 200 eager calls with fresh inputs (the slot parity and the
flags cycling); then µs per call inside a CUDA graph of :data:`CALLS` calls: fused, against the engine's pair
(``one_shot`` all-reduce then ``rms_norm``) and NCCL's (``nccl`` then ``rms_norm``). Prints a table; writes
``tp_ar_norm.json`` under ``--out``. A hang (a barrier that never opens) is cut by ``timeout`` around the command.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from lab.scripts.tp_comm_bench import _graph_us, init_rank, spawn_ranks
from oscarkv.kernels.allreduce_norm import PeerBuffers, all_reduce_rms_norm
from oscarkv.kernels.fused import rms_norm
from oscarkv.models.allreduce import make_all_reduce, norm_peers

CALLS = 64
ROWS, WIDTHS = (1, 8, 64), (4096, 5120)


def _case(rows: int, width: int, size: int, seed: int, device):
    g = torch.Generator().manual_seed(seed)
    parts = [torch.randn(rows, width, generator=g).to(device, torch.bfloat16) for _ in range(size)]
    residual = torch.randn(rows, width, generator=g).to(device, torch.bfloat16)
    w = (1 + 0.1 * torch.randn(width, generator=g)).to(device, torch.bfloat16)
    return parts, residual, w


def check(rank: int, size: int, peers: PeerBuffers, device) -> list[dict]:
    out = []
    for width in WIDTHS:
        for rows in ROWS:
            for call in range(200):
                parts, residual, w = _case(rows, width, size, 1000 * width + 10 * rows + call, device)
                got, got_res = all_reduce_rms_norm(parts[rank], residual, w, 1e-6, peers)
            total = torch.stack([p.float() for p in parts]).sum(0).bfloat16()
            want, want_res = rms_norm(total, w, 1e-6, residual)
            every = [torch.empty_like(got) for _ in range(size)]
            dist.all_gather(every, got)
            out.append(dict(rows=rows, width=width, res_equal=float((got_res == want_res).float().mean()),
                            out_max_err=float((got.float() - want.float()).abs().max()),
                            ranks_identical=all(torch.equal(e, every[0]) for e in every)))
    return out


def timing(rank: int, size: int, peers: PeerBuffers, device) -> list[dict]:
    kinds = {k: make_all_reduce(k, dist.group.WORLD, device, torch.bfloat16, max(ROWS) * max(WIDTHS))
             for k in ("one_shot", "nccl")}
    out = []
    for width in WIDTHS:
        for rows in ROWS:
            parts, residual, w = _case(rows, width, size, 7, device)
            x = parts[rank]
            row = dict(rows=rows, width=width,
                       fused_us=_graph_us(lambda: all_reduce_rms_norm(x, residual, w, 1e-6, peers), device))
            for k, reduce in kinds.items():
                y = x.clone()
                row[f"{k}_norm_us"] = _graph_us(lambda: rms_norm(reduce(y), w, 1e-6, residual), device)
            out.append(row)
    return out


def _rank(rank: int, size: int, path: str, out: str) -> None:
    device = init_rank(rank, size, path, minutes=2)
    peers = norm_peers(dist.group.WORLD, max(ROWS) * max(WIDTHS), max(ROWS), device)
    result = dict(ranks=size, device=torch.cuda.get_device_name(device), torch=torch.__version__,
                  check=check(rank, size, peers, device), timing=timing(rank, size, peers, device))
    if rank == 0:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "tp_ar_norm.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result["check"]), flush=True)
        print(f"{size} x {result['device']}: µs per call, {CALLS} in a CUDA graph", flush=True)
        print("| rows x D | fused | one_shot + rms_norm | nccl + rms_norm |\n|---|---:|---:|---:|")
        for t in result["timing"]:
            print(f"| {t['rows']} x {t['width']} | {t['fused_us']:.2f} | {t['one_shot_norm_us']:.2f} | "
                  f"{t['nccl_norm_us']:.2f} |", flush=True)
    dist.destroy_process_group()


def main() -> None:
    spawn_ranks(_rank, __doc__)


if __name__ == "__main__":
    main()
