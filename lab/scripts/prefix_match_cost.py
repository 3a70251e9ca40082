"""Host cost of a prefix-cache hit on a long document (issue 29): ``KVCacheManager.match_prefix`` of a request whose
``context``-token prefix is cached (the follow-up turn of ``oscarkv bench followup``), no model, no tensors.

One sequence of ``context`` tokens fills the pools through ``plan``/``commit`` (chunks of one page, as the bench's
``cache_prefix`` does); then each repeat admits a fresh sequence of the same tokens plus ``new`` more and times its
``match_prefix``, then frees it: once with the page keys hashed by the match itself, once with them hashed
beforehand as ``Admission.validate`` does (``ValidRequest.page_keys``), that hashing timed apart. Prints medians.

    PYTHONPATH=. python -m lab.scripts.prefix_match_cost --context 102400 --method oscar
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field

from oscarkv.cache.manager import KVCacheManager
from oscarkv.cache.page_pool import PagePool
from oscarkv.cache.seq_kv import ChunkSchedule, SeqKV, page_keys
from oscarkv.config import KVConfig


@dataclass
class Seq:
    token_ids: list[int]
    schedule: ChunkSchedule
    kv: SeqKV = field(default_factory=SeqKV)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=102400)
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--method", default="oscar")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    kv = KVConfig(a.method)
    P, pages = kv.page_size, a.context // kv.page_size + 16
    mgr = KVCacheManager(kv, PagePool(pages), PagePool(pages) if a.method != "bf16" else None)
    tokens = [(i * 7919) % 151_000 for i in range(a.context + a.new)]
    first = Seq(tokens[:a.context], ChunkSchedule(a.context, P))
    while first.kv.num_tokens < a.context:
        mgr.commit(first, mgr.plan(first, first.schedule.end(first.kv.num_tokens)))
    mgr.free(first)
    for admitted in (False, True):
        hashing, times = [], []
        for _ in range(a.repeats):
            seq = Seq(list(tokens), ChunkSchedule(len(tokens), P))
            t = time.perf_counter()
            if admitted:
                seq.kv.keys = page_keys(b"", seq.token_ids, range(len(tokens) // P), seq.schedule, P)
            hashing.append(time.perf_counter() - t)
            t = time.perf_counter()
            hit = mgr.match_prefix(seq)
            times.append(time.perf_counter() - t)
            assert hit == a.context, hit
            mgr.free(seq)
        where = "keys hashed at admission" if admitted else "keys hashed by the match"
        print(f"{a.method} {where}: admission {ms(hashing)}, match_prefix of {len(tokens)} tokens "
              f"({a.context} cached) {ms(times)}")


def ms(times: list[float]) -> str:
    return f"{statistics.median(times) * 1e3:.2f} ms (min {min(times) * 1e3:.2f})"

if __name__ == "__main__":
    main()
