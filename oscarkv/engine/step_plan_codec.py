"""A step's write plans as one flat ``int32`` array: what rank 0 sends the tensor-parallel ranks each step.

Role: :class:`PlanEncoder` (rank 0) turns the :class:`~oscarkv.cache.manager.WritePlan` s of a step into
one ``int32`` numpy array; :class:`PlanDecoder` (every other rank) turns it back into plans equal to the
ones the ranks read (``register``, ``release``, ``release_stale`` and ``after_hit`` are rank 0's bookkeeping, not sent). The
array then goes over the gloo group as a tensor (:class:`Channel`, used by ``oscarkv.engine.workers``): no
pickling, one broadcast of a fixed frame (a second for the rest of a long message).

Layout (``int32``; all counts are elements)::

    header [HEADER]:   kind, n_plans, total length, 0 (reserved); a control message's arguments follow it
    records [n_plans, RECORD]:
        t0, t1, view_bf16_len, has_window, window.view_start, window.view_len,
        n_slots, n_demote, n_view_bf16, n_int2_kept, n_int2_new, n_window_slots, n_window_view
    payload, plan after plan:
        slots, demote_src, demote_dst, view_bf16, view_int2[n_int2_kept:], window.slots, window.view

The INT2 view is sent as a delta: ``n_int2_kept`` leading pages are those of the plan in the same row of
the previous message (a decoding sequence keeps its row and its history only grows, so a 100K-token
view of 1,600 pages is usually sent as 0 or 1 new page); the decoder keeps the previous message's views.
NOTE: encoder and decoder are stateful and must see the same messages in the same order (the broadcast
gives every rank every message); a row whose old view is not a prefix of the new one is sent whole.

Values must fit in ``int32`` (page ids, slots and positions do; numpy raises ``OverflowError`` if not).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from oscarkv.cache.manager import WritePlan
from oscarkv.cache.window import WindowPlan

HEADER = 4
"""Header elements: kind, plan count, total length, reserved."""
RECORD = 13
"""Record elements per plan (see the module docstring)."""
STEP, STOP, REPLAY, PROFILE, HOST_PROFILE, CAPTURE = 1, 2, 3, 4, 5, 6
"""Message kinds: a step's plans; leave the worker loop; replay the decode graph of a bucket (arguments: the
bucket); profile replays of it (the bucket, the replays). Those two time every rank's graph together
(a rank's graph holds all-reduces and replays only with the others'). ``HOST_PROFILE``: start (argument ``rank_profile.FUNCTIONS`` or
``OPERATORS``) or end and print (``OFF``) a profile of the worker's host over the steps between. ``CAPTURE``: capture every piecewise
bucket now, every rank at once (start-up)."""
FRAME = 2048
"""Elements of the first broadcast of every message (8 KB: a decode step of 32 sequences whose INT2
views grew by a page, or a batch-1 step of up to ~1,900 new pages); the rest, if any, follows in a second."""


def control(kind: int, *args: int) -> np.ndarray:
    """A message without plans (``STOP``, ``REPLAY``, ``PROFILE``, ``HOST_PROFILE``, ``CAPTURE``): the header, then
    ``args``."""
    return np.array([kind, 0, HEADER + len(args), 0, *args], dtype=np.int32)


def header(msg: np.ndarray) -> tuple[int, int, int, int]:
    """``(kind, n_plans, total length, reserved)`` of a message (its first :data:`HEADER` elements suffice)."""
    kind, n, total, arg = (int(v) for v in msg[:HEADER])
    return kind, n, total, arg


class Channel:
    """Messages from rank 0 to every rank over a gloo group: a fixed :data:`FRAME`, then the rest if any.
    NOTE: every rank must call ``send`` (rank 0) or ``receive`` (the others) for every message, in order."""

    def __init__(self, group, src: int = 0) -> None:
        self.group, self.src = group, src
        self.frame = torch.zeros(FRAME, dtype=torch.int32)

    def send(self, msg: np.ndarray) -> None:
        k = min(len(msg), FRAME)
        self.frame.numpy()[:k] = msg[:k]
        dist.broadcast(self.frame, src=self.src, group=self.group)
        if len(msg) > FRAME:
            dist.broadcast(torch.from_numpy(msg[FRAME:]), src=self.src, group=self.group)

    def receive(self) -> np.ndarray:
        dist.broadcast(self.frame, src=self.src, group=self.group)
        total = header(self.frame.numpy())[2]
        if total <= FRAME:
            return self.frame.numpy()[:total].copy()
        rest = torch.empty(total - FRAME, dtype=torch.int32)
        dist.broadcast(rest, src=self.src, group=self.group)
        return np.concatenate([self.frame.numpy(), rest.numpy()])


class PlanEncoder:
    """Rank 0's side: plans to arrays, the INT2 views as deltas against the previous step's (same rows)."""

    def __init__(self) -> None:
        self.prev: list[list[int]] = []  # the INT2 view of each row of the last message

    def encode(self, plans: list[WritePlan]) -> np.ndarray:
        records, payload, views = [], [], []
        for i, p in enumerate(plans):
            kept = self._kept(i, p.view_int2)
            w = p.window
            wslots, wview = (w.slots, w.view) if w is not None else ((), ())
            records += [p.t0, p.t1, p.view_bf16_len, w is not None, w.view_start if w else 0, w.view_len if w else 0,
                        len(p.slots), len(p.demote_src), len(p.view_bf16), kept, len(p.view_int2) - kept,
                        len(wslots), len(wview)]
            for part in (p.slots, p.demote_src, p.demote_dst, p.view_bf16, p.view_int2[kept:], wslots, wview):
                payload += part
            views.append(p.view_int2)
        self.prev = views
        total = HEADER + len(records) + len(payload)
        return np.array([STEP, len(plans), total, 0, *records, *payload], dtype=np.int32)

    def _kept(self, row: int, view: list[int]) -> int:
        """Leading pages of ``view`` equal to the previous message's view of ``row`` (0: sent whole)."""
        if row >= len(self.prev):
            return 0
        old = self.prev[row]
        return len(old) if len(old) <= len(view) and view[:len(old)] == old else 0


class PlanDecoder:
    """A worker's side: arrays back to plans (``register`` and ``release`` empty)."""

    def __init__(self) -> None:
        self.prev: list[list[int]] = []

    def decode(self, msg: np.ndarray) -> list[WritePlan]:
        kind, n, total, _ = header(msg)
        assert kind == STEP and total == len(msg), f"not a whole step message: kind {kind}, {total} != {len(msg)}"
        values = msg.tolist()  # NOTE: Python ints once, then list slices (faster than slicing the array)
        recs = values[HEADER:HEADER + n * RECORD]
        at, plans = HEADER + n * RECORD, []
        for i in range(n):
            t0, t1, bf16_len, has_w, w_start, w_len, *counts = recs[i * RECORD:(i + 1) * RECORD]
            n_slots, n_dem, n_bf16, kept, new, n_ws, n_wv = counts
            parts = []
            for c in (n_slots, n_dem, n_dem, n_bf16, new, n_ws, n_wv):
                parts.append(values[at:at + c])
                at += c
            slots, src, dst, bf16, int2_new, wslots, wview = parts
            window = WindowPlan(wslots, wview, w_start, w_len) if has_w else None
            plans.append(WritePlan(t0, t1, slots, src, dst, bf16, bf16_len, (self.prev[i][:kept] if kept else []) + int2_new,
                                   window=window))
        self.prev = [p.view_int2 for p in plans]
        return plans
