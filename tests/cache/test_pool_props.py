"""Property tests of the page pools, tier bookkeeping and prefix cache (no tensors, no model).

Random interleavings of admit (with prefix matching) / append (chunks and decode steps,
which demote) / fork (a new sequence sharing a prefix) / free / preempt must never leak or
double-free a page; reference counts always equal the number of sequences listing a page,
tiers match :func:`oscarkv.quant.bpe.tiers` after every step, and everything returns to
zero references at the end.
"""

from collections import Counter
from dataclasses import dataclass, field

from itertools import accumulate

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oscarkv.cache.manager import KVCacheManager
from oscarkv.cache.page_pool import PagePool, PoolExhausted
from oscarkv.cache.seq_kv import ChunkSchedule, SeqKV
from oscarkv.config import KVConfig
from oscarkv.quant.bpe import tiers


@dataclass
class FakeSeq:
    token_ids: list[int]
    schedule: ChunkSchedule
    kv: SeqKV = field(default_factory=SeqKV)


def check(mgr: KVCacheManager, seqs: list[FakeSeq]) -> None:
    mgr.bf16.check()
    held_b = Counter(p for s in seqs for p in s.kv.sink + s.kv.recent)
    for page in range(1, mgr.bf16.num_pages):
        assert mgr.bf16.ref(page) == held_b[page], page
    if mgr.int2 is not None:
        mgr.int2.check()
        held_i = Counter(p for s in seqs for p in s.kv.history)
        for page in range(1, mgr.int2.num_pages):
            assert mgr.int2.ref(page) == held_i[page], page
    kv = mgr.kv
    for s in seqs:
        want = tiers(s.kv.num_tokens, kv.sink, kv.recent, kv.page_size) if mgr.quantized else None
        got = mgr.tier_tokens(s)
        if want is not None:
            assert got == tuple(want), (s.kv.num_tokens, got, want)
        assert len(s.kv.sink) == -(-min(s.kv.num_tokens, kv.sink) // kv.page_size)


def step(mgr, seq, t1) -> bool:
    plan = mgr.plan(seq, t1)
    if plan is None:
        return False
    assert len(plan.slots) == t1 - plan.t0 and len(set(plan.slots)) == len(plan.slots)
    assert plan.view_bf16_len + len(plan.view_int2) * mgr.P == plan.t0  # the view is the whole prefix
    mgr.commit(seq, plan)
    return True


ops = st.lists(st.tuples(st.sampled_from(["admit", "append", "fork", "free", "preempt"]),
                         st.integers(0, 10**6)), min_size=5, max_size=40)


@pytest.mark.parametrize("method", ["oscar", "bf16"])
@settings(max_examples=60, deadline=None)
@given(ops=ops, pages=st.integers(4, 24), caching=st.booleans())
def test_random_interleavings_never_leak(method, ops, pages, caching):
    kv = KVConfig(method, sink=4, recent=4, page_size=2)
    mgr = KVCacheManager(kv, PagePool(pages), PagePool(pages) if method != "bf16" else None, caching)
    seqs: list[FakeSeq] = []
    base = [7, 3, 9, 1, 4, 4, 2, 8, 5, 6, 0, 2, 7, 7, 1, 3]
    for op, r in ops:
        if op == "admit" or (op == "fork" and not seqs):
            n = 2 + r % 14
            seq = FakeSeq(base[:n] + [r % 5] * 20, ChunkSchedule(n, 4))
            mgr.match_prefix(seq)
            seqs.append(seq)
        elif op == "fork":
            src = seqs[r % len(seqs)]
            seq = FakeSeq(list(src.token_ids), src.schedule)
            mgr.match_prefix(seq)
            seqs.append(seq)
        elif op == "append" and seqs:
            seq = seqs[r % len(seqs)]
            t0 = seq.kv.num_tokens
            if t0 < len(seq.token_ids):
                step(mgr, seq, seq.schedule.end(t0))
        elif op in ("free", "preempt") and seqs:
            seq = seqs[r % len(seqs)]
            mgr.free(seq)
            if op == "free":
                seqs.remove(seq)
        check(mgr, seqs)
    for seq in seqs:
        mgr.free(seq)
    check(mgr, [])
    assert mgr.bf16.num_used == 0 and (mgr.int2 is None or mgr.int2.num_used == 0)


def test_tiers_at_every_decode_step():
    kv = KVConfig("oscar", sink=4, recent=6, page_size=2)
    mgr = KVCacheManager(kv, PagePool(64), PagePool(64))
    seq = FakeSeq(list(range(50)), ChunkSchedule(5, 4))
    while seq.kv.num_tokens < 50:
        assert step(mgr, seq, seq.schedule.end(seq.kv.num_tokens))
        check(mgr, [seq])
        t = seq.kv.num_tokens
        if t > kv.sink:
            assert kv.recent <= mgr.tier_tokens(seq)[2] < kv.recent + kv.page_size or t < kv.sink + kv.recent + kv.page_size


def test_prefix_hit_restores_state_of_cold_run():
    kv = KVConfig("oscar", sink=4, recent=4, page_size=2)
    mgr = KVCacheManager(kv, PagePool(64), PagePool(64))
    prompt = list(range(30))
    a = FakeSeq(prompt + [1, 2], ChunkSchedule(30, 8))
    while a.kv.num_tokens < 32:
        step(mgr, a, a.schedule.end(a.kv.num_tokens))
    b = FakeSeq(prompt[:26] + [99, 98], ChunkSchedule(28, 8))
    hit = mgr.match_prefix(b)
    assert hit == 24  # the last chunk start below the prompt's end that is fully cached
    assert mgr.tier_tokens(b) == tuple(tiers(24, 4, 4, 2))
    assert b.kv.history == a.kv.history[: len(b.kv.history)]  # shared INT2 history pages
    c = FakeSeq(prompt[:26] + [99, 98], ChunkSchedule(28, 8))  # same prompt: shares b's pages too
    assert mgr.match_prefix(c) == 24
    for s in (a, b, c):
        mgr.free(s)
    check(mgr, [])


def test_different_chunk_schedules_do_not_share_pages():
    kv = KVConfig("oscar", sink=4, recent=4, page_size=2)
    mgr = KVCacheManager(kv, PagePool(64), PagePool(64))
    a = FakeSeq(list(range(20)), ChunkSchedule(20, 8))
    while a.kv.num_tokens < 20:
        step(mgr, a, a.schedule.end(a.kv.num_tokens))
    b = FakeSeq(list(range(20)), ChunkSchedule(20, 8, boundaries=(10,)))
    assert mgr.match_prefix(b) == 0


def test_pool_eviction_is_lru():
    pool = PagePool(4)
    pages = [pool.allocate() for _ in range(3)]
    for i, p in enumerate(pages):
        pool.register(p, bytes([i]))
    for p in pages:
        pool.release(p)
    assert pool.lookup(bytes([0])) == pages[0]  # revived: no longer evictable
    new = pool.allocate()  # evicts the least recently released of the rest
    assert new == pages[1] and not pool.peek(bytes([1])) and pool.peek(bytes([2]))
    pool.allocate()
    with pytest.raises(PoolExhausted):
        pool.allocate()
    pool.check()


def test_stale_pages_are_evicted_first():
    pool = PagePool(5)
    pages = [pool.allocate() for _ in range(4)]
    for i, p in enumerate(pages):
        pool.register(p, bytes([i]))
    pool.release_all(pages[:2])
    pool.release_all(pages[2:], stale=True)  # released later, evicted before the others
    assert [pool.allocate() for _ in range(4)] == [pages[3], pages[2], pages[0], pages[1]]
    pool.check()


def test_explicit_schedule_check():
    kv = KVConfig("oscar", sink=4, recent=4, page_size=4)
    mgr = KVCacheManager(kv, PagePool(8), PagePool(8))
    mgr.check_schedule(ChunkSchedule(26, 8, boundaries=(22,)))  # short tail chunk: fine
    with pytest.raises(ValueError, match="starts inside a page"):
        mgr.check_schedule(ChunkSchedule(60, 8, boundaries=(10,)))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(["bf16", "oscar"]), st.integers(0, 2), st.integers(1, 12), st.sampled_from([1, 2, 4]),
       st.integers(1, 40), st.integers(1, 3), st.integers(0, 60))
def test_pages_needed_is_the_peak_of_a_run_alone(method, sink_pages, recent, page, prompt, chunk_pages, gen):
    """``pages_needed`` equals the most pages a sequence holds while it runs alone."""
    kv = KVConfig(method, sink=sink_pages * page, recent=recent, page_size=page)
    mgr = KVCacheManager(kv, PagePool(512), PagePool(512) if method != "bf16" else None, prefix_caching=False)
    seq = FakeSeq(list(range(prompt + gen)), ChunkSchedule(prompt, chunk_pages * page))
    peak_b = peak_i = 0
    while seq.kv.num_tokens < prompt + gen:
        plan = mgr.plan(seq, seq.schedule.end(seq.kv.num_tokens))
        peak_b, peak_i = max(peak_b, mgr.bf16.num_used), max(peak_i, mgr.int2.num_used if mgr.int2 else 0)
        mgr.commit(seq, plan)
    assert mgr.pages_needed(seq.schedule, prompt + gen) == (peak_b, peak_i, 0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(1, 12), st.sampled_from([1, 2, 4]), st.integers(1, 60), st.integers(0, 70), st.integers(3, 40))
def test_draft_end_is_the_step_by_step_rule(recent, page, prompt, limit, pages):
    """``draft_end`` (a bisection) is the longest extension the step-by-step rule reaches: no demotion, and new BF16
    pages beyond those of the step itself only from the free list."""
    kv = KVConfig("oscar", sink=page, recent=recent, page_size=page)
    mgr = KVCacheManager(kv, PagePool(pages), PagePool(64), prefix_caching=False)
    seq = FakeSeq(list(range(prompt + 1)), ChunkSchedule(prompt, 4 * page))
    while seq.kv.num_tokens < prompt and (plan := mgr.plan(seq, seq.schedule.end(seq.kv.num_tokens))):
        mgr.commit(seq, plan)
    t1 = seq.kv.num_tokens + 1
    base, t, h = mgr._bf16_new(seq, t1), t1, mgr.hist_end(t1)
    while t < t1 + limit and mgr.hist_end(t + 1) == h:
        need = mgr._bf16_new(seq, t + 1)
        if need > base and need > mgr.bf16.num_free:
            break
        t += 1
    assert mgr.draft_end(seq, t1, t1 + limit) == t


def test_release_all_is_release_in_order():
    pools = [PagePool(12), PagePool(12)]
    for pool in pools:
        pages = [pool.allocate() for _ in range(8)]
        for p in pages[::3]:
            pool.register(p, bytes([p]))
        pool.lookup(bytes([pages[3]]))  # a second reference: stays used
    pools[0].release_all(pages)
    for p in pages:
        pools[1].release(p)
    for a, b in zip(vars(pools[0]).values(), vars(pools[1]).values()):
        assert a == b
    pools[0].check()
    with pytest.raises(AssertionError, match="double free"):
        pools[0].release_all([pages[0]])


def _one_step(mgr: KVCacheManager, t0: int, t1: int) -> int:
    """The BF16 pages of one step ``[t0, t1)``, one at a time: the sink's, then ``[hist_end(t0), t1)``."""
    S0, P = mgr.kv.sink, mgr.P
    recent = -(-(t1 - mgr.hist_end(t0)) // P) if t1 > S0 else 0
    return -(-min(t1, S0) // P) + recent


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.sampled_from(["bf16", "oscar"]), st.integers(0, 2), st.integers(1, 12), st.sampled_from([1, 2, 4]),
       st.lists(st.integers(1, 80), min_size=1, max_size=6), st.integers(1, 60))
def test_pages_needed_steps_vectorized_equal_one_by_one(method, sink_pages, recent, page, cuts, gen):
    """Every step's BF16 pages, as ``pages_needed`` computes them at once, equal the one-step formula, for
    explicit chunk boundaries too."""
    kv = KVConfig(method, sink=sink_pages * page, recent=recent, page_size=page)
    mgr = KVCacheManager(kv, PagePool(512), PagePool(512) if method != "bf16" else None, prefix_caching=False)
    bounds = tuple(sorted(set(accumulate(cuts))))
    sched = ChunkSchedule(bounds[-1] + 1, 4 * page, boundaries=bounds[:-1])
    t0 = np.array(sched.starts() + list(range(sched.prompt_len, sched.prompt_len + gen)), dtype=np.int64)
    t1 = sched.ends(t0)
    assert mgr._bf16_pages_in_steps(t0, t1).tolist() == [_one_step(mgr, a, b) for a, b in zip(t0.tolist(), t1.tolist())]


@given(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True), st.lists(st.integers(0, 7), max_size=8))
def test_lookup_all_is_lookup_of_each(keys, used):
    """``lookup_all`` (the prefix hit's loop) leaves two pools in the same state as ``lookup`` key by key: the same
    pages, references and eviction order (cached pages revived, used ones shared)."""
    pools = [PagePool(10), PagePool(10)]
    for pool in pools:
        for k in range(8):
            page = pool.allocate()
            pool.register(page, bytes([k]))
            if k not in used:
                pool.release(page)
    assert pools[0].lookup_all([bytes([k]) for k in keys]) == [pools[1].lookup(bytes([k])) for k in keys]
    for pool in pools:
        pool.check()
    assert [pools[0].ref(p) for p in range(10)] == [pools[1].ref(p) for p in range(10)]
    assert list(pools[0]._evictable) == list(pools[1]._evictable)
