"""What crosses between tensor-parallel ranks, timed on one multi-GPU host: all-reduces and step plans.

Run: ``python -m lab.scripts.tp_comm_bench --out DIR`` (every visible GPU, one process each; ``--ranks N``).

1. All-reduce of decode messages ``[rows, D]`` bf16 (rows 1, 8, 32; D 4096 and 5120: Qwen3-8B and -32B) for
   each kind of ``oscarkv.models.allreduce`` (nccl, one_shot, two_shot): the sum checked against the exact
   one (every rank draws every rank's input from its seed), then µs per call inside a CUDA graph of
   :data:`CALLS` calls, and eager.
2. A step's plans from rank 0 to the others, per message at 100K context (``plan_codec_bench``'s steps; batch
   1 and 32, page size 64): pickled (``broadcast_object_list``, what the engine did), the codec over gloo
   (``step_plan_codec.Channel``, what it does), and the codec as a device broadcast (host to GPU, NCCL, GPU to
   host on the receiving ranks): µs per message on the slowest rank.
Prints two tables; writes ``tp_comm.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lab.scripts.plan_codec_bench import decode_plans
from oscarkv.engine.step_plan_codec import Channel, PlanDecoder, PlanEncoder
from oscarkv.models.allreduce import make_all_reduce

CALLS = 64
"""All-reduces per captured graph (the 72 of a 36-layer step, roughly)."""
ROWS, WIDTHS = (1, 8, 32), (4096, 5120)


def _inputs(rows: int, width: int, size: int, device) -> list[torch.Tensor]:
    return [torch.randn(rows, width, generator=torch.Generator().manual_seed(r)).to(device, torch.bfloat16)
            for r in range(size)]


def _graph_us(fn, device) -> float:
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.synchronize(device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        for _ in range(CALLS):
            fn()
    return _timed(g.replay, device) / CALLS


def _timed(fn, device, reps: int = 20) -> float:
    fn()
    dist.barrier()
    torch.cuda.synchronize(device)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize(device)
    return 1e3 * a.elapsed_time(b) / reps


def all_reduce_rows(rank: int, size: int, device) -> list[dict]:
    rows = []
    for kind in ("nccl", "one_shot", "two_shot"):
        try:
            reduce = make_all_reduce(kind, dist.group.WORLD, device, torch.bfloat16, max(ROWS) * max(WIDTHS))
        except Exception as e:  # a torch without the operator, or no peer access: say so, go on
            rows.append(dict(kind=kind, error=repr(e)[:200]))
            continue
        for width in WIDTHS:
            for r in ROWS:
                xs = _inputs(r, width, size, device)
                want = torch.stack([x.float() for x in xs]).sum(0)
                got = reduce(xs[rank].clone()).float()
                err = (got - want).abs().max().item() / want.abs().max().item()
                x = xs[rank].clone()
                # NOTE: nccl sums in place (the input grows each call: timing only; fine for bf16 at 64 calls)
                rows.append(dict(kind=kind, rows=r, width=width, bytes=r * width * 2, rel_err=err,
                                 graph_us=_graph_us(lambda: reduce(x), device), eager_us=_timed(lambda: reduce(x), device)))
    return rows


def _per_message_us(fn, reps: int) -> float:
    dist.barrier()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    dist.barrier()
    return 1e6 * (time.perf_counter() - t) / reps


def plan_rows(rank: int, device, control) -> list[dict]:
    out = []
    for batch in (1, 32):
        steps = [decode_plans(batch, 102400, 64, s) for s in range(2)]
        reps = 50 if batch == 1 else 10
        enc, dec, chan = PlanEncoder(), PlanDecoder(), Channel(control)
        row = dict(batch=batch)

        def pickled():
            box = [steps[1] if rank == 0 else None]
            dist.broadcast_object_list(box, src=0, group=control)
        row["pickle_us"] = _per_message_us(pickled, reps)
        if rank == 0:
            chan.send(enc.encode(steps[0]))
        else:
            dec.decode(chan.receive())
        i = [0]

        def codec():  # the steady state: alternate between two steps, each a one-page delta or none
            i[0] ^= 1
            if rank == 0:
                chan.send(enc.encode(steps[i[0]]))
            else:
                dec.decode(chan.receive())
        row["codec_gloo_us"] = _per_message_us(codec, reps)
        msg = torch.from_numpy(PlanEncoder().encode(steps[1])).pin_memory()
        dev = torch.empty(len(msg), dtype=torch.int32, device=device)

        def on_device():  # the whole message (no delta): its size is known here, as a frame's would be
            if rank == 0:
                dev.copy_(msg, non_blocking=True)
            dist.broadcast(dev, src=0)
            if rank:
                dev.cpu()
        row["device_broadcast_us"] = _per_message_us(on_device, reps)
        row["message_bytes"] = msg.numel() * 4
        out.append(row)
    return out


def init_rank(rank: int, size: int, path: str, minutes: int = 3) -> torch.device:
    """This process's GPU and the NCCL group of ``size`` ranks meeting at the file ``path``."""
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"file://{path}", rank=rank, world_size=size,
                            timeout=timedelta(minutes=minutes), device_id=device)
    return device


def _rank(rank: int, size: int, path: str, out: str) -> None:
    device = init_rank(rank, size, path)
    control = dist.new_group(backend="gloo")
    result = dict(ranks=size, device=torch.cuda.get_device_name(device), torch=torch.__version__,
                  all_reduce=all_reduce_rows(rank, size, device), plans=plan_rows(rank, device, control))
    if rank == 0:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "tp_comm.json").write_text(json.dumps(result, indent=1))
        print(format_tables(result), flush=True)
    dist.destroy_process_group()


def format_tables(r: dict) -> str:
    lines = [f"{r['ranks']} x {r['device']}, torch {r['torch']}; all-reduce µs per call ({CALLS} in a CUDA graph | eager)",
             "| kind | rows x D | bytes | graph us | eager us | rel err |", "|---|---|---:|---:|---:|---:|"]
    for a in r["all_reduce"]:
        if "error" in a:
            lines.append(f"| {a['kind']} | unavailable: {a['error']} | | | | |")
        else:
            lines.append(f"| {a['kind']} | {a['rows']} x {a['width']} | {a['bytes']:,} | {a['graph_us']:.2f} | "
                         f"{a['eager_us']:.2f} | {a['rel_err']:.1e} |")
    lines += ["step plans at 100K, P = 64: µs per message (slowest rank)",
              "| batch | pickle (gloo) | codec (gloo) | codec whole, device broadcast | whole message bytes |",
              "|---:|---:|---:|---:|---:|"]
    lines += [f"| {p['batch']} | {p['pickle_us']:.0f} | {p['codec_gloo_us']:.0f} | {p['device_broadcast_us']:.0f} | "
              f"{p['message_bytes']:,} |" for p in r["plans"]]
    return "\n".join(lines)


def spawn_ranks(rank_fn, doc: str) -> None:
    """``--ranks N --out DIR`` from the command line, then ``rank_fn(rank, N, rendezvous file, DIR)`` in one process
    per rank."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--ranks", type=int, default=torch.cuda.device_count())
    p.add_argument("--out", default=".")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_fn, args=(a.ranks, str(Path(tmp) / "rdv"), a.out), nprocs=a.ranks, join=True)


def main() -> None:
    spawn_ranks(_rank, __doc__)


if __name__ == "__main__":
    main()
