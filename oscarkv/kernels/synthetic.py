"""Random mixed paged caches for kernel tests and benchmarks (no model, no engine).

:func:`random_cache` lays out a batch of sequences in the pools of
:mod:`oscarkv.cache.paged_layout` with the tier rule of DESIGN.md §3
(:func:`oscarkv.quant.bpe.tiers`): BF16 sink pages, then recent-window pages, INT2 history
pages in between. Page ids are shuffled so that kernels must follow the tables; page 0 is the
scratch page and is filled with NaN so that a kernel reading it is caught. INT2 pages hold the
real encoding (:func:`oscarkv.quant.int2.quantize`, with a 2-bit level table when given) of random
data, so scales and zeros are realistic.
"""

from __future__ import annotations

import torch

from oscarkv.cache.paged_layout import Int2Pages, LayerKV, PageTables
from oscarkv.quant.bpe import tiers
from oscarkv.quant.int2 import Levels, quantize


def _tables(per_seq: list[list[int]], device) -> torch.Tensor:
    width = max([1, *map(len, per_seq)])
    t = torch.zeros(len(per_seq), width, dtype=torch.int32)
    for b, pages in enumerate(per_seq):
        t[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    return t.to(device)


def random_int2_pool(n: int, h: int, p: int, d: int, group: int, device, gen: torch.Generator,
                     bits: int = 2, levels: Levels | None = None) -> Int2Pages:
    """``n`` history pages holding the ``bits``-bit encoding of standard-normal data (encoded in chunks; ``levels``:
    a 2-bit level table)."""
    codes = torch.empty(n, h, p, d * bits // 8, dtype=torch.uint8, device=device)
    scale = torch.empty(n, h, p, d // group, dtype=torch.float16, device=device)
    zero = torch.empty_like(scale)
    step = max(1, (1 << 22) // (h * p * d))
    for lo in range(0, n, step):
        x = torch.randn(min(step, n - lo), h, p, d, generator=gen, device=device)
        pk = quantize(x.bfloat16().float(), bits, group, levels)
        codes[lo : lo + step], scale[lo : lo + step], zero[lo : lo + step] = pk
    return Int2Pages(codes, scale, zero, bits, levels)


def random_cache(lens: list[int], heads: int, head_dim: int, *, page: int = 16, group: int | None = None,
                 sink: int = 64, recent: int = 256, int2: bool = True, device="cpu",
                 seed: int = 0, shuffle: bool = True, bits: tuple[int, int] = (2, 2),
                 levels: tuple[Levels | None, Levels | None] = (None, None)) -> tuple[LayerKV, PageTables]:
    """A batch of sequences of ``lens`` tokens in freshly filled pools (one layer).

    ``int2=False`` keeps every token in BF16 (a ``kv=bf16`` cache); ``bits``: key and value bits of
    the history pages; ``levels``: their 2-bit level tables (``None``: uniform). Pages are placed in random
    order unless ``shuffle=False`` (consecutive pages, as a freshly filled engine pool holds them)."""
    group = group or min(head_dim, 128)
    assert sink % page == 0, "the layout contract needs sink % page == 0"
    gen = torch.Generator(device=device).manual_seed(seed)
    bf_counts, in_counts = [], []
    for t in lens:
        tr = tiers(t, sink, recent, page) if int2 else None
        bf, hist = (t, 0) if tr is None else (tr.sink + tr.recent, tr.history)
        bf_counts.append(bf)
        in_counts.append(hist)
    # pages per sequence; sink and recent runs each start on a page boundary
    bf_pages = [(-(-min(t, sink) // page) + -(-(b - min(t, sink)) // page)) if int2 else -(-b // page)
                for t, b in zip(lens, bf_counts)]
    in_pages = [h // page for h in in_counts]
    nb, ni = sum(bf_pages) + 1, sum(in_pages) + 1  # + scratch page 0
    perm_b = (torch.randperm(nb - 1, generator=torch.Generator().manual_seed(seed)) + 1).tolist()
    perm_i = (torch.randperm(ni - 1, generator=torch.Generator().manual_seed(seed + 1)) + 1).tolist()
    if not shuffle:
        perm_b, perm_i = sorted(perm_b), sorted(perm_i)
    bt, it, ob, oi = [], [], 0, 0
    for nbp, nip in zip(bf_pages, in_pages):
        bt.append(perm_b[ob : ob + nbp])
        it.append(perm_i[oi : oi + nip])
        ob, oi = ob + nbp, oi + nip
    bf_k = torch.randn(nb, heads, page, head_dim, generator=gen, device=device, dtype=torch.bfloat16)
    bf_v = torch.randn(nb, heads, page, head_dim, generator=gen, device=device, dtype=torch.bfloat16)
    bf_k[0], bf_v[0] = float("nan"), float("nan")
    ik = iv = None
    if int2:
        ik = random_int2_pool(ni, heads, page, head_dim, group, device, gen, bits[0], levels[0])
        iv = random_int2_pool(ni, heads, page, head_dim, group, device, gen, bits[1], levels[1])
        for pool in (ik, iv):
            pool.scale[0], pool.zero[0] = float("nan"), float("nan")
    # the sink's last page may be partial only when the sequence is shorter than the sink;
    # the recent window then is empty, so "every listed page full except the last" holds.
    tables = PageTables(
        bf16_table=_tables(bt, device),
        bf16_lens=torch.tensor(bf_counts, dtype=torch.int32, device=device),
        int2_table=_tables(it, device),
        int2_lens=torch.tensor(in_counts, dtype=torch.int32, device=device),
    )
    return LayerKV(bf_k, bf_v, ik, iv), tables
