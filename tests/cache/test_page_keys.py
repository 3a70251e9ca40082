"""Page content keys (``oscarkv.cache.seq_kv.page_keys``): hashed once per page and request, chained, and the
same whichever way they are batched (the admission's bulk, a prefix match, a commit's one page)."""

import random

import numpy as np
import pytest

from oscarkv.cache import seq_kv
from oscarkv.cache.manager import KVCacheManager
from oscarkv.cache.page_pool import PagePool
from oscarkv.cache.seq_kv import ChunkSchedule, SeqKV, page_keys
from oscarkv.config import KVConfig
from tests.cache.test_pool_props import FakeSeq, check, step


class CountingHash:
    """Stands in for ``seq_kv._HASH`` and counts its calls."""

    def __init__(self, real) -> None:
        self.real, self.calls = real, 0

    def __call__(self, data: bytes):
        self.calls += 1
        return self.real(data)


@pytest.fixture
def hashes(monkeypatch) -> CountingHash:
    counter = CountingHash(seq_kv._HASH)
    monkeypatch.setattr(seq_kv, "_HASH", counter)
    return counter


def firsts(schedule: ChunkSchedule, pos: np.ndarray) -> np.ndarray:
    """Start of the chunk that holds each position (a decode token: itself): the oracle of ``ChunkSchedule.runs``."""
    starts = np.array(schedule.starts(), dtype=np.int64)
    return np.where(pos >= schedule.prompt_len, pos, starts[np.searchsorted(starts, pos, side="right") - 1])


def run(mgr: KVCacheManager, seq: FakeSeq, t: int) -> None:
    while seq.kv.num_tokens < t:
        assert step(mgr, seq, seq.schedule.end(seq.kv.num_tokens))


@pytest.mark.parametrize("method", ["oscar", "bf16"])
def test_each_page_is_hashed_once_per_request(method, hashes):
    kv = KVConfig(method, sink=4, recent=4, page_size=2)
    mgr = KVCacheManager(kv, PagePool(128), PagePool(128) if method != "bf16" else None)
    tokens = [random.randrange(1000) for _ in range(61)]
    a = FakeSeq(tokens, ChunkSchedule(40, 8))
    mgr.match_prefix(a)
    run(mgr, a, 33)
    mgr.free(a)  # preempted: resumes through its own cached pages
    assert mgr.match_prefix(a) == 32
    run(mgr, a, 61)
    assert hashes.calls == 61 // 2  # every full page once: prompt, decode, preemption and resume
    b = FakeSeq(list(tokens), ChunkSchedule(40, 8))  # a second request of the same tokens hashes them once too
    assert mgr.match_prefix(b) == 32
    run(mgr, b, 61)
    assert hashes.calls == 2 * (61 // 2) and b.kv.keys == a.kv.keys
    mgr.free(a)
    mgr.free(b)
    check(mgr, [])


def test_changed_token_changes_keys_from_its_page_on():
    P, schedule = 4, ChunkSchedule(37, 8, boundaries=(6, 13))
    tokens = [random.randrange(50_000) for _ in range(40)]
    keys = page_keys(b"", tokens, range(10), schedule, P)
    assert len(set(keys)) == 10 and all(len(k) == 32 for k in keys)
    for pos in (0, 5, 17, 39):
        other = list(tokens)
        other[pos] += 1
        changed = page_keys(b"", other, range(10), schedule, P)
        i = pos // P
        assert changed[:i] == keys[:i] and all(x != y for x, y in zip(changed[i:], keys[i:]))


def test_keys_depend_on_the_chunk_schedule():
    tokens = list(range(32))
    base = page_keys(b"", tokens, range(8), ChunkSchedule(32, 8), 4)
    moved = page_keys(b"", tokens, range(8), ChunkSchedule(32, 8, boundaries=(12,)), 4)
    shorter = page_keys(b"", tokens, range(8), ChunkSchedule(30, 8), 4)  # the chunk [24, 30) computed page 6
    assert moved[0] != base[0] and shorter[:6] == base[:6] and shorter[6] != base[6]


@pytest.mark.parametrize("schedule", [ChunkSchedule(23, 6), ChunkSchedule(23, 6, boundaries=(5, 9, 20))])
def test_keys_are_the_same_in_any_batches(schedule):
    tokens = [random.randrange(1000) for _ in range(45)]
    whole = page_keys(b"", tokens, range(15), schedule, 3)
    one_by_one = SeqKV()
    for i in range(15):
        one_by_one.key(i, tokens, schedule, 3)
    split = SeqKV(keys=whole[:4])
    assert one_by_one.keys == whole and split.prefix_keys(15, tokens, schedule, 3) == whole
    assert split.prefix_keys(6, tokens, schedule, 3) == whole[:6]


def test_keys_hash_chunk_starts_and_tiers_not_ends():
    """Two chunks from one start whose ends give the same tiers compute the same bytes: equal keys; another start
    (a resume point) or other tiers: other keys from that page on."""
    tokens = list(range(32))
    flat = lambda ends: np.zeros_like(ends)  # noqa: E731  (every end reads the prefix with the same tiers)
    longer = page_keys(b"", tokens, range(8), ChunkSchedule(32, 8), 4, flat)
    shorter = page_keys(b"", tokens, range(7), ChunkSchedule(30, 8), 4, flat)
    assert shorter == longer[:7]
    resumed = page_keys(b"", tokens, range(8), ChunkSchedule(32, 8, resume=(12,)), 4, flat)
    assert resumed[:3] == longer[:3] and all(x != y for x, y in zip(resumed[3:], longer[3:]))
    by_end = page_keys(b"", tokens, range(8), ChunkSchedule(32, 8), 4, lambda ends: (ends >= 24).astype(ends.dtype))
    assert by_end[:4] == longer[:4] and by_end[4] != longer[4]  # chunk [16, 24) reads its prefix otherwise


def test_resume_schedule():
    s = ChunkSchedule(40, 16, resume=(24,))  # chunks run 16 long from each anchor: 0, then the resume point
    assert s.starts() == [0, 16, 24] and [s.end(t) for t in (0, 16, 24, 32, 40)] == [16, 24, 40, 40, 41]
    two = ChunkSchedule(60, 16, resume=(8, 40))
    assert two.starts() == [0, 8, 24, 40, 56] and [two.end(t) for t in two.starts()] == [8, 24, 40, 56, 60]
    pos = np.arange(45)
    assert s.ends(pos).tolist() == [s.end(int(t)) if t >= 40 else s.end(max(x for x in s.starts() if x <= t))
                                    for t in pos]
    assert firsts(s, pos).tolist() == [t if t >= 40 else max(x for x in s.starts() if x <= t) for t in pos]
    pos = np.arange(64)
    assert two.ends(pos).tolist() == [two.end(int(t)) if t >= 60 else two.end(max(x for x in two.starts() if x <= t))
                                      for t in pos]
    with pytest.raises(ValueError, match="resume"):
        ChunkSchedule(40, 16, boundaries=(8,), resume=(24,))


@pytest.mark.parametrize("schedule", [ChunkSchedule(40, 16), ChunkSchedule(40, 16, resume=(24, 36)),
                                      ChunkSchedule(40, 16, resume=(4,)),
                                      ChunkSchedule(40, 16, boundaries=(5, 9, 33)), ChunkSchedule(7, 16)])
def test_runs_give_each_position_its_chunk(schedule):
    """``ChunkSchedule.runs`` (what page keys are built from, once per chunk) says per position what ``firsts`` and
    ``ends`` say, for any range: inside the prompt, across its end, and past it (decode positions)."""
    for lo, hi in ((0, 40), (3, 29), (16, 32), (24, 50), (40, 47), (0, 1), (5, 5)):
        first, end, length = schedule.runs(lo, hi)
        pos = np.arange(lo, hi)
        assert length.sum() == hi - lo and (length > 0).all()
        assert np.repeat(first, length).tolist() == firsts(schedule, pos).tolist()
        assert np.repeat(end, length).tolist() == schedule.ends(pos).tolist()


def test_key_memo_gives_the_keys_page_keys_gives(hashes):
    """``KeyMemo`` (the admission's memory of recent prompts): every prompt's keys equal ``page_keys`` cold, for
    follow-ups that extend a held prompt, share part of it, resume inside it, carry a salt or change one token's
    record (tokens, chunk start or tiers); a follow-up hashes only the pages after the first one that differs."""
    P, rng = 4, random.Random(7)
    doc = [rng.randrange(500) for _ in range(40)]
    memo = seq_kv.KeyMemo(size=2)

    def check_keys(tokens, schedule, tiers=np.zeros_like):  # tiers: as a cache that has not demoted yet
        records = seq_kv.page_records(tokens, range(len(tokens) // P), schedule, P, tiers)
        before = hashes.calls
        got = memo.keys(records, schedule.salt())
        hashed = hashes.calls - before
        assert got == page_keys(b"", tokens, range(len(tokens) // P), schedule, P, tiers)
        return hashed

    assert check_keys(doc, ChunkSchedule(40, 8)) == 10
    turn = doc + [rng.randrange(500) for _ in range(13)]
    assert check_keys(turn, ChunkSchedule(53, 8, resume=(40,))) == 3  # pages 10-12 only; it replaces doc
    other = turn[:20] + [999] + turn[21:]  # one token in page 5
    assert check_keys(other, ChunkSchedule(53, 8, resume=(40,))) == 13 - 5
    assert check_keys(turn, ChunkSchedule(53, 8)) == 0  # the same chunks as resuming at 40
    assert check_keys(turn[:12], ChunkSchedule(12, 8)) == 0  # a prefix of it (and not held)
    assert check_keys(turn, ChunkSchedule(53, 16)) == 13 - 2  # chunk starts differ from page 2 (position 8)
    assert check_keys(turn, ChunkSchedule(53, 16), lambda e: e // 32 + 1) == 13  # other tiers from page 0
    assert check_keys(turn, ChunkSchedule(53, 8, boundaries=(24,))) == 13  # a salt: nothing shared
    assert check_keys([rng.randrange(500, 900) for _ in range(30)], ChunkSchedule(30, 8)) == 7
    assert check_keys(doc, ChunkSchedule(40, 8), None) == 10  # chunk ends as tiers: page 0's differ
    assert memo.reused == 10 + 5 + 13 + 3 + 2 and len(memo._held) == 2


def test_key_memo_from_several_threads():
    """A server validates requests on several threads: keys from one shared ``KeyMemo`` stay ``page_keys``' under
    concurrent calls (prompts that share a document, extend one another or share nothing)."""
    from concurrent.futures import ThreadPoolExecutor

    P, rng = 4, random.Random(11)
    doc = [rng.randrange(500) for _ in range(400)]
    prompts = [doc[:n] + [rng.randrange(500) for _ in range(extra)] for n in (400, 200, 96) for extra in (0, 9, 40)]
    prompts += [[rng.randrange(500) for _ in range(64)] for _ in range(3)]
    memo = seq_kv.KeyMemo(size=3)

    def keys(tokens):
        sched = ChunkSchedule(len(tokens), 16)
        records = seq_kv.page_records(tokens, range(len(tokens) // P), sched, P, np.zeros_like)
        return memo.keys(records, b""), page_keys(b"", tokens, range(len(tokens) // P), sched, P, np.zeros_like)

    with ThreadPoolExecutor(6) as pool:
        for got, want in pool.map(keys, prompts * 4):
            assert got == want
    assert len(memo._held) <= 3


def test_held_ids_give_each_prompt_as_int32():
    """``HeldIds`` (the admission's int32 prompts): each prompt's array equals a fresh conversion — follow-ups built
    on a held prompt's list (the same ints), equal values in new objects, a changed token inside, a prefix of a held
    prompt, interleaved conversations; what the caller does to its list afterwards changes nothing held."""
    from oscarkv.engine.admission import HeldIds

    rng, held = random.Random(3), HeldIds(size=2)
    doc = [rng.randrange(70000) for _ in range(300)]
    other = [rng.randrange(70000) for _ in range(50)]
    turn = doc + [5, 6]
    prompts = [doc, turn, [int(str(t)) for t in turn] + [7], turn[:100] + [1] + turn[101:], other, turn + [8], doc[:10]]
    reused = [0, 300, 302, 100, 0, 100, 10]  # the longest shared start among the held (two) prompts
    for p, r in zip(prompts, reused):
        before = held.reused
        got = held.int32(tuple(p))
        assert got.dtype == np.int32 and got.tolist() == p and held.reused - before == r
        p.append(99)  # the caller's list, reused: the held tuple does not see it
    assert len(held._held) == 2 and held.int32(tuple(turn[:-1])).tolist() == turn[:-1]


@pytest.mark.parametrize("page", [1, 2, 16, 17, 40, 79])
def test_key_memo_reuses_up_to_the_first_page_that_differs(page):
    """Wherever two prompts part (the rows are compared in blocks that double), the keys before that page are
    reused and the rest hashed: the keys ``page_keys`` gives."""
    P, rng = 4, random.Random(page)
    base = [rng.randrange(500) for _ in range(80 * P)]
    other = base[:page * P + 1] + [999] + base[page * P + 2:]
    memo, sched = seq_kv.KeyMemo(), ChunkSchedule(80 * P, 16)
    records = [seq_kv.page_records(t, range(80), sched, P, np.zeros_like) for t in (base, other)]
    memo.keys(records[0], b"")
    assert memo.keys(records[1], b"") == page_keys(b"", other, range(80), sched, P, np.zeros_like)
    assert memo.reused == page
