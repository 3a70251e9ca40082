"""``oscarkv bench attention``: decode attention time and achieved bandwidth, BF16 vs INT2 caches.

For each (context, batch) the run builds random paged caches (:mod:`oscarkv.kernels.synthetic`)
of the requested attention shape (default Qwen3-8B: 32 query heads, 8 KV heads, head_dim 128)
and times, as medians of repeats after warm-up (``triton.testing.do_bench``):

* ``bf16``  — :func:`oscarkv.kernels.decode.decode_attention` over an all-BF16 cache;
* ``int2``  — the same kernel over the mixed cache (BF16 sink + recent window, INT2 history);
* ``int2-lm`` (``levels``) — the same cache with a non-uniform 2-bit level table (``BENCH_LEVELS``) on its
  2-bit kinds: the kernels' Lloyd-Max path (the table's values do not change the work);
* ``torch`` — PyTorch's ``scaled_dot_product_attention`` on dense BF16 K/V (its fastest backend);
* ``copy``  — a device-to-device copy, measured once: the achievable bandwidth.

Achieved bandwidth = bytes the step must read (each cached byte once, plus q and out) / time. Each kind's output
is also compared with the fp32 oracle over the same stored cache (``reference.decode_attention_ref``): the error
must not grow with the tokens a split sums (``splits`` falls as the batch grows; ``decode_int2._add_tile``).
It prints tables and writes the numbers as JSON. It needs a CUDA device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from oscarkv.quant.bpe import tiers
from oscarkv.bench import e2e
from oscarkv.bench.configs import AttentionBench

BENCH_LEVELS = (0.0, 0.875, 2.125, 3.0)
"""The level table of the ``int2-lm`` column (a Lloyd-Max-like one; any table costs the same)."""


@dataclass
class Row:
    context: int
    batch: int
    us: dict[str, float] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    gbps: dict[str, float] = field(default_factory=dict)
    err: dict[str, float] = field(default_factory=dict)
    """Relative error of the kernel's output against the fp32 oracle over the same stored cache, per kind."""
    splits: dict[str, int] = field(default_factory=dict)
    """The decode kernel's split count per kind (``decode.decode_splits``): each split sums ``context / splits``
    tokens, the length the kernels' accumulation must hold up over."""


def _time_us(fn) -> float:
    import triton.testing

    return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def copy_bandwidth(gib: float = 2.0) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    n = int(gib * 2**30) // 4
    a = torch.randn(n, device="cuda")
    b = torch.empty_like(a)
    us = _time_us(lambda: b.copy_(a))
    return 2 * a.numel() * 4 / us / 1e3


def cache_bytes(cfg: AttentionBench, context: int, batch: int, int2: bool, group: int | None = None) -> int:
    """Bytes one decode step must read for one layer: K and V once, q in, out written."""
    h, d = cfg.kv_heads, cfg.head_dim
    g = group or min(d, 128)
    if int2:  # K and V: BF16 windows, then history codes (d·bits/8) and fp16 scale + zero per group
        tr = tiers(context, cfg.sink, cfg.recent, cfg.page_size)
        per_tok = 2 * (tr.sink + tr.recent) * d * 2 + tr.history * sum(d * b // 8 + 4 * (d // g)
                                                                          for b in (cfg.key_bits, cfg.value_bits))
    else:
        per_tok = 2 * context * d * 2
    return batch * (h * per_tok + 2 * cfg.q_heads * d * 2)


def _torch_peer(cfg: AttentionBench, context: int, batch: int) -> float:
    q = torch.randn(batch, cfg.q_heads, 1, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, cfg.kv_heads, context, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return _time_us(lambda: sdpa(q, k, v, enable_gqa=True))


def measure(cfg: AttentionBench, context: int, batch: int, configs: dict | None = None) -> Row:
    """One table row. ``configs`` may override the kernel tiles per kind (``{"int2": {...}}``)."""
    # NOTE: imported here so that ``oscarkv --help`` never imports Triton (whose CPU interpreter
    # switch is read when a kernel module is first imported).
    from oscarkv.kernels.decode import decode_attention, decode_splits
    from oscarkv.kernels.reference import decode_attention_ref
    from oscarkv.kernels.synthetic import random_cache

    row = Row(context, batch)
    configs = configs or {}
    for kind in ("bf16", "int2") + (("int2-lm",) if cfg.levels else ()):
        low = kind != "bf16"
        nbytes = cache_bytes(cfg, context, batch, low)
        if nbytes > cfg.memory_gib * 2**30:
            continue
        bits = (cfg.key_bits, cfg.value_bits)
        levels = tuple(BENCH_LEVELS if kind == "int2-lm" and b == 2 else None for b in bits)
        kv, tables = random_cache([context] * batch, cfg.kv_heads, cfg.head_dim, page=cfg.page_size, sink=cfg.sink,
                                  recent=cfg.recent, int2=low, device="cuda", seed=context + batch, bits=bits,
                                  levels=levels)
        q = torch.randn(batch, cfg.q_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
        scale = cfg.head_dim**-0.5
        config = configs.get(kind.split("-")[0])
        attend = lambda: decode_attention(q, kv, tables, scale, config=config)  # noqa: E731
        ref = decode_attention_ref(q.float(), kv, tables, scale)
        row.err[kind] = float((attend().float() - ref).norm() / ref.norm())
        row.splits[kind] = decode_splits(kv, batch, q.device, config)
        row.us[kind] = _time_us(attend)
        row.bytes[kind] = nbytes
        row.gbps[kind] = nbytes / row.us[kind] / 1e3
        kv = tables = None  # NOTE: frees them (rebound, not del: the timed lambda closes over these names)
        torch.cuda.empty_cache()
    if cache_bytes(cfg, context, batch, False) <= cfg.memory_gib * 2**30:
        row.us["torch"] = _torch_peer(cfg, context, batch)
        row.gbps["torch"] = cache_bytes(cfg, context, batch, False) / row.us["torch"] / 1e3
        torch.cuda.empty_cache()
    return row


def format_table(rows: list[Row], copy_gbps: float) -> str:
    lines = [f"copy bandwidth (read + write): {copy_gbps:.0f} GB/s",
             f"{'context':>8} {'batch':>5} | {'bf16 us':>9} {'%copy':>6} | {'int2 us':>9} {'%copy':>6} | "
             f"{'torch us':>9} {'%copy':>6} | {'bf16/int2':>9} {'torch/bf16':>10}"]
    for r in rows:
        def cell(k):
            if k not in r.us:
                return f"{'-':>9} {'-':>6}"
            return f"{r.us[k]:9.1f} {100 * r.gbps[k] / copy_gbps:5.0f}%"
        ratio = f"{r.us['bf16'] / r.us['int2']:9.2f}" if {"bf16", "int2"} <= r.us.keys() else f"{'-':>9}"
        peer = f"{r.us['torch'] / r.us['bf16']:10.2f}" if {"bf16", "torch"} <= r.us.keys() else f"{'-':>10}"
        lines.append(f"{r.context:8d} {r.batch:5d} | {cell('bf16')} | {cell('int2')} | {cell('torch')} | {ratio} {peer}")
    lines += ["", f"{'context':>8} {'batch':>5} | relative error against the fp32 oracle (splits)"]
    lines += [f"{r.context:8d} {r.batch:5d} | " + "  ".join(f"{k} {e:.1e} ({r.splits[k]})" for k, e in r.err.items())
              for r in rows]
    if any("int2-lm" in r.us for r in rows):
        lines += ["", f"{'context':>8} {'batch':>5} | {'int2 us':>9} {'int2-lm us':>10} {'lm/int2':>8}"]
        lines += [f"{r.context:8d} {r.batch:5d} | {r.us['int2']:9.1f} {r.us['int2-lm']:10.1f} "
                  f"{r.us['int2-lm'] / r.us['int2']:8.3f}" for r in rows if {"int2", "int2-lm"} <= r.us.keys()]
    return "\n".join(lines)


def run(cfg: AttentionBench, out: Path | None) -> str:
    if not torch.cuda.is_available():
        raise RuntimeError("bench attention needs a CUDA device")
    copy_bandwidth(), copy_bandwidth()  # NOTE: warm-up: the card idles at a low clock
    copy_gbps = copy_bandwidth()
    rows = [measure(cfg, c, b) for c in cfg.contexts for b in cfg.batches]
    table = format_table(rows, copy_gbps)
    e2e.write_json(out, cfg, [asdict(r) for r in rows], copy_gbps=copy_gbps,
                   splits_note="default_splits(batch, kv_heads)")
    return table

