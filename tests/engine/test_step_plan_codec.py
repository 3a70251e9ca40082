"""The step-plan codec (``oscarkv.engine.step_plan_codec``): every message decodes to the plans the ranks read.

Reference: the plans themselves with ``register``, ``release`` and ``release_stale`` cleared (``ParallelRunner``
never sent them). Sequences of random steps exercise the INT2-view delta: rows that grow by a page, keep their view,
shrink (a preempted sequence's row taken by another), change order, or appear and vanish; empty steps,
empty lists, windows on some plans only, and values at the ``int32`` limit. The channel carries messages
of every length against its frame between two gloo processes.
"""

import random
from datetime import timedelta
from dataclasses import replace

import numpy as np
import pytest
import torch.multiprocessing as mp

from oscarkv.cache.manager import WritePlan
from oscarkv.cache.window import WindowPlan
from oscarkv.engine.step_plan_codec import (FRAME, HEADER, PROFILE, REPLAY, STEP, STOP, Channel, PlanDecoder,
                                            PlanEncoder, control, header)

BIG = 2**31 - 1


def _ints(rng: random.Random, n: int, top: int = 10_000) -> list[int]:
    return [rng.randrange(top) for _ in range(n)]


def _plan(rng: random.Random, int2: list[int]) -> WritePlan:
    t0 = rng.randrange(200_000)
    n = rng.choice([1, 1, 1, 3, 17])
    dem = rng.choice([0, 0, 1, 2])
    window = None
    if rng.random() < 0.4:
        window = WindowPlan(_ints(rng, n), _ints(rng, rng.randrange(4)), 64 * rng.randrange(100), rng.randrange(64),
                            register=[(1, 2)], release=[3])
    return WritePlan(t0, t0 + n, _ints(rng, n, BIG), _ints(rng, dem), _ints(rng, dem), _ints(rng, rng.randrange(6)),
                     rng.randrange(400), int2, register=[("bf16", 1, 2)], release=[4, 5], release_stale=[6],
                     window=window)


def _next_views(rng: random.Random, views: list[list[int]]) -> list[list[int]]:
    """The next step's INT2 views: most rows grow or stay, some are replaced, the batch may change size."""
    out = []
    for v in views:
        r = rng.random()
        out.append(v + _ints(rng, 1) if r < 0.3 else v if r < 0.7 else _ints(rng, rng.randrange(30)) if r < 0.85
                   else v[:len(v) // 2])
    if rng.random() < 0.1:
        rng.shuffle(out)
    if rng.random() < 0.2:
        out = out[:rng.randrange(len(out) + 1)]
    return out + [_ints(rng, rng.randrange(50)) for _ in range(rng.choice([0, 0, 1, 3]))]


def _read(p: WritePlan) -> WritePlan:
    """What a rank reads of a plan."""
    w = p.window and replace(p.window, register=[], release=[])
    return replace(p, register=[], release=[], release_stale=[], window=w)


@pytest.mark.parametrize("seed", range(6))
def test_round_trip_over_steps(seed):
    rng = random.Random(seed)
    enc, dec = PlanEncoder(), PlanDecoder()
    views = [_ints(rng, rng.randrange(100)) for _ in range(rng.choice([0, 1, 5, 32]))]
    for _ in range(25):
        plans = [_plan(rng, v) for v in views]
        msg = enc.encode(plans)
        assert msg.dtype == np.int32 and header(msg)[:3] == (STEP, len(plans), len(msg))
        assert dec.decode(msg.copy()) == [_read(p) for p in plans]
        views = _next_views(rng, views)


def test_delta_sends_only_new_pages():
    """A long view sent once; the next steps carry only the pages added (1,600 pages: 100K tokens, P = 64)."""
    rng = random.Random(0)
    enc, dec = PlanEncoder(), PlanDecoder()
    view = _ints(rng, 1600)
    first = enc.encode([_plan(rng, view)])
    plan = _plan(rng, view + [7])
    second = enc.encode([plan])
    assert len(first) - len(second) >= 1600 - 60  # the rest of the record differs by a few random lists
    dec.decode(first)
    assert dec.decode(second)[0].view_int2 == view + [7]


def test_empty_messages():
    enc, dec = PlanEncoder(), PlanDecoder()
    assert dec.decode(enc.encode([])) == []
    plan = WritePlan(5, 6, [BIG])  # every list empty but the slot, the largest slot an int32 holds
    assert dec.decode(enc.encode([plan])) == [plan]


def test_control_messages():
    for kind, args in ((STOP, ()), (REPLAY, (32,)), (PROFILE, (8, 5))):
        msg = control(kind, *args)
        assert header(msg) == (kind, 0, HEADER + len(args), 0) and msg[HEADER:].tolist() == list(args)


def _messages() -> list[np.ndarray]:
    """Messages around the frame's size (shorter, exactly, one more, several frames), then ``STOP``."""
    rng = np.random.default_rng(0)
    out = [control(REPLAY, 3)]
    for n in (5, FRAME, FRAME + 1, 3 * FRAME + 7):
        m = rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)
        m[:HEADER] = (STEP, 0, n, 0)
        out.append(m)
    return out + [control(STOP)]


def _channel_rank(rank: int, path: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    channel = Channel(dist.group.WORLD)
    for m in _messages():
        if rank == 0:
            channel.send(m)
        elif not np.array_equal(channel.receive(), m):
            raise SystemExit(1)
    dist.destroy_process_group()


def test_channel_over_gloo(tmp_path):
    """Two gloo ranks (this process sends, a spawned one checks): every message arrives whole, whatever its
    length against the frame."""
    child = mp.get_context("spawn").Process(target=_channel_rank, args=(1, str(tmp_path / "rdv")))
    child.start()
    try:
        _channel_rank(0, str(tmp_path / "rdv"))
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0


def test_overflow_raises():
    with pytest.raises(OverflowError):
        PlanEncoder().encode([WritePlan(0, 1, [2**31])])
