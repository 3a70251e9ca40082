"""``oscarkv bench {attention, decode, capacity}``: GPU benchmarks; each prints a table and writes JSON to ``--out``."""

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
    _setup_decode(sub.add_parser("decode", help="end-to-end batch-1 decode tok/s vs the bandwidth floor, BF16 vs INT2"))
    _setup_capacity(sub.add_parser("capacity", help="tokens in a KV budget and 32 x 100K job throughput, BF16 vs INT2"))


def _setup_decode(p: argparse.ArgumentParser) -> None:
    from oscarkv.bench.decode import DecodeBench

    d = DecodeBench()
    p.add_argument("--shapes", nargs="+", default=list(d.shapes), help="model shapes (oscarkv.models.shapes)")
    p.add_argument("--contexts", type=int, nargs="+", default=list(d.contexts), help="prompt tokens")
    p.add_argument("--methods", nargs="+", default=list(d.methods), help="KV methods (bf16, naive, oscar: a random artifact)")
    p.add_argument("--steps", type=int, default=d.steps, help="timed decode steps")
    p.add_argument("--kv-gib", type=float, default=d.kv_gib, help="KV pool budget")
    p.add_argument("--profile", action="store_true", help="per-kernel profile at the longest context (slows later rows)")
    p.add_argument("--batch", type=int, default=d.batch, help="sequences decoding together, each at the context")
    p.add_argument("--temperature", type=float, default=d.temperature, help="sampling temperature (0: greedy)")
    p.add_argument("--out", type=Path, default=Path("bench_decode.json"), help="JSON file to write")


def _setup_capacity(p: argparse.ArgumentParser) -> None:
    from oscarkv.bench.capacity import CapacityBench

    d = CapacityBench()
    p.add_argument("--shape", default=d.shape, help="model shape (oscarkv.models.shapes)")
    p.add_argument("--kv-gib", type=float, default=d.kv_gib, help="KV pool budget (the same for every method)")
    p.add_argument("--context", type=int, default=d.context, help="prompt tokens per request")
    p.add_argument("--requests", type=int, default=d.requests)
    p.add_argument("--new-tokens", type=int, default=d.new_tokens, help="greedy tokens per request")
    p.add_argument("--methods", nargs="+", default=list(d.methods), choices=[m for m, _ in d.chunks],
                   help=f"KV methods, bf16 among them (oscar: a random artifact); default: {' '.join(d.methods)}")
    p.add_argument("--out", type=Path, default=Path("bench_capacity.json"), help="JSON file to write")


def run_bench(args: argparse.Namespace) -> int:
    if args.bench == "decode":
        from oscarkv.bench import decode

        cfg = decode.DecodeBench(tuple(args.shapes), tuple(args.contexts), tuple(args.methods), steps=args.steps,
                                 kv_gib=args.kv_gib, batch=args.batch, temperature=args.temperature,
                                 profile=args.profile)
        print(decode.run(cfg, args.out))
        return 0
    if args.bench == "capacity":
        from oscarkv.bench import capacity

        try:
            cfg = capacity.CapacityBench(args.shape, args.kv_gib, args.context, args.requests, args.new_tokens,
                                         tuple(args.methods))
        except ValueError as e:  # a bad --methods: the message, not a traceback
            raise SystemExit(f"oscarkv bench capacity: {e}") from None
        print(capacity.run(cfg, args.out))
        return 0
    from oscarkv.bench import attention

    cfg = AttentionBench(tuple(args.contexts), tuple(args.batches), args.q_heads, args.kv_heads, args.head_dim)
    print(attention.run(cfg, args.out))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="oscarkv bench")
    setup_bench(parser)
    raise SystemExit(run_bench(parser.parse_args()))
