"""``oscarkv bench {attention}``: GPU benchmarks; each prints a table and writes JSON to ``--out``."""

from __future__ import annotations

import argparse
from pathlib import Path

from oscarkv.bench.attention import AttentionBench


def setup_bench(p: argparse.ArgumentParser) -> None:
    """GPU benchmarks (attention kernels, BF16 vs INT2)."""
    sub = p.add_subparsers(dest="bench", required=True)
    a = sub.add_parser("attention", help="decode attention time and bandwidth, BF16 vs INT2 vs PyTorch")
    d = AttentionBench()
    a.add_argument("--contexts", type=int, nargs="+", default=list(d.contexts), help="tokens per sequence")
    a.add_argument("--batches", type=int, nargs="+", default=list(d.batches), help="sequences per step")
    a.add_argument("--q-heads", type=int, default=d.q_heads)
    a.add_argument("--kv-heads", type=int, default=d.kv_heads)
    a.add_argument("--head-dim", type=int, default=d.head_dim)
    a.add_argument("--out", type=Path, default=Path("bench_attention.json"), help="JSON file to write")


def run_bench(args: argparse.Namespace) -> int:
    from oscarkv.bench import attention

    cfg = AttentionBench(tuple(args.contexts), tuple(args.batches), args.q_heads, args.kv_heads, args.head_dim)
    print(attention.run(cfg, args.out))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="oscarkv bench")
    setup_bench(parser)
    raise SystemExit(run_bench(parser.parse_args()))
