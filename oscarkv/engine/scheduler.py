"""Continuous batching with one token budget per step (no prefill/decode modes).

Role: each step, pick which sequences compute which chunk, get their pages from the
:class:`~oscarkv.cache.manager.KVCacheManager`, and hand the model runner one
:class:`SchedulerOutput` — the only object that crosses from scheduler to runner. The
scheduler owns the ``waiting`` queue and the ``running`` list.

Policy (vLLM v1's, first come first served):

1. running sequences in order: the decode token or the next prefill chunk of each, while the
   budget lasts (a chunk that does not fit waits for the next step; chunk ends are fixed by
   the sequence's :class:`~oscarkv.cache.seq_kv.ChunkSchedule`);
2. when the pools cannot hold a running sequence's step, the most recently admitted running
   sequence not yet scheduled this step is **preempted by recompute**: its pages are freed
   (keyed ones stay cached), it goes back to the front of ``waiting`` with its generated
   tokens, and later replays them exactly;
3. then waiting sequences, in order, up to ``max_num_seqs`` running: prefix-cache match, then
   their first chunk.

Overlap (:meth:`Scheduler.schedule_ahead`): while a decode step runs on the device, the engine may
plan the next one before its tokens are known, when that changes nothing the policy above would
decide: every running sequence was in the step and none of them needs a preemption. While a
waiting sequence could take a seat, at most every other step is planned ahead, so that one the
policy would admit is admitted at most one step later than without overlap.

NOTE: no request is lost or duplicated: a sequence is in exactly one of ``waiting``,
``running`` or finished, and the cache manager's reference counts are released exactly once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from oscarkv.cache.manager import KVCacheManager, WritePlan
from oscarkv.config import EngineConfig
from oscarkv.engine.sequence import PENDING, Sequence, Status


@dataclass
class ScheduledChunk:
    """Sequence ``seq`` computes tokens ``[plan.t0, plan.t1)`` with the pages of ``plan``."""

    seq: Sequence
    plan: WritePlan
    drafts: list[int] = field(default_factory=list)
    """Drafted tokens this decode step verifies (``oscarkv.engine.speculative``): the plan covers the
    sampled token and them; the engine truncates it to the accepted ones before committing it."""
    samples: bool = field(init=False)
    """Whether the chunk reaches the last token of the sequence when scheduled (so a new token is
    sampled). NOTE: fixed here; a step planned ahead appends to ``token_ids`` while this one runs."""

    def __post_init__(self) -> None:
        self.samples = self.plan.t1 == len(self.seq.token_ids) + len(self.drafts)


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    ahead: bool = False  # planned by schedule_ahead (before the previous step's tokens were known)

    @property
    def num_tokens(self) -> int:
        return sum(c.plan.t1 - c.plan.t0 for c in self.chunks)


class Scheduler:
    """Waiting queue, running batch and the per-step policy (see the module docstring)."""

    def __init__(self, cfg: EngineConfig, manager: KVCacheManager,
                 drafter: Callable[[Sequence, int], list[int]] | None = None) -> None:
        """``drafter(seq, limit)``: at most ``limit`` drafted tokens for ``seq``'s decode step (speculative
        decoding, ``oscarkv.engine.speculative``); ``None``: no speculation."""
        self.cfg, self.manager, self.drafter = cfg, manager, drafter
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0  # a statistic (server metrics)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out, budget = SchedulerOutput(), self.cfg.max_num_batched_tokens
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:  # preempted earlier in this loop
                continue
            t0, t1 = seq.next_chunk()
            if t1 - t0 > budget:
                continue
            drafts, plan = self._speculate(seq, t1, budget)
            plan = plan or self._plan_or_preempt(seq, t1, out)
            if plan is not None:
                out.chunks.append(ScheduledChunk(seq, plan, drafts if plan.t1 > t1 else []))
                budget -= plan.t1 - t0
        if not out.preempted:
            budget = self._admit(out, budget)
        return out

    def schedule_ahead(self, current: SchedulerOutput, continuing: list[Sequence]) -> SchedulerOutput | None:
        """The decode step after ``current`` (a decode step still running) for ``continuing`` (those of its
        sequences that did not reach ``max_tokens``), planned now, each with a :data:`PENDING` input
        token; ``None`` (nothing changed) unless :meth:`schedule` after ``current`` would plan this or,
        should a sequence stop early, a subset of it — or, while a sequence waits for a seat, would admit
        it too, which then happens one step later (see the module docstring)."""
        in_step = {id(c.seq) for c in current.chunks if c.seq.status is Status.RUNNING}
        if len(in_step) != len(self.running) or any(id(s) not in in_step for s in self.running):
            return None  # a running sequence waits for budget, or was admitted since
        if self.waiting and len(continuing) < self.cfg.max_num_seqs and current.ahead:
            return None  # the policy might admit one: every other step is planned after the tokens, admitting
        t1s = [s.num_computed + 1 for s in continuing]
        if len(continuing) > self.cfg.max_num_batched_tokens or not self.manager.fits(continuing, t1s):
            return None
        out = SchedulerOutput(ahead=True)
        for seq, t1 in zip(continuing, t1s):
            seq.token_ids.append(PENDING)
            out.chunks.append(ScheduledChunk(seq, self.manager.plan(seq, t1)))
        return out

    def _speculate(self, seq: Sequence, t1: int, budget: int) -> tuple[list[int], WritePlan | None]:
        """Drafts for a sampled decode step to ``t1`` and the plan covering them; ``([], None)`` when there
        are none or the pools are short for them (the step then runs without drafts, preempting nothing
        for them). Drafts never pass ``max_tokens`` nor make the step demote (``KVCacheManager.draft_end``)."""
        if self.drafter is None or t1 != len(seq.token_ids) or t1 <= seq.num_prompt:
            return [], None
        limit = min(budget - 1, seq.params.max_tokens - len(seq.output_ids) - 1)
        drafts = self.drafter(seq, self.manager.draft_end(seq, t1, t1 + max(0, limit)) - t1)
        plan = self.manager.plan(seq, t1 + len(drafts)) if drafts else None
        return (drafts, plan) if plan is not None else ([], None)

    def _plan_or_preempt(self, seq: Sequence, t1: int, out: SchedulerOutput) -> WritePlan | None:
        scheduled = None  # built on the first shortage only: a per-sequence set costs O(batch²) per step
        while (plan := self.manager.plan(seq, t1)) is None:
            scheduled = scheduled or {id(c.seq) for c in out.chunks}
            victims = [s for s in self.running if id(s) not in scheduled]
            victim = victims[-1]  # seq itself is always a candidate
            if victim is seq and len(self.running) == 1 and not out.chunks:
                raise RuntimeError(f"request {seq.request_id}: the KV pools cannot hold one sequence of "
                                   f"{t1} tokens; raise EngineConfig.kv_memory_bytes")
            self._preempt(victim, out)
            if victim is seq:
                return None
        return plan

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.num_preemptions += 1
        self.manager.free(seq)
        self.running.remove(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def _admit(self, out: SchedulerOutput, budget: int) -> int:
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            self.manager.match_prefix(seq)
            t0, t1 = seq.next_chunk()
            plan = self.manager.plan(seq, t1) if t1 - t0 <= budget else None
            if plan is None:
                if not self.running and not out.chunks and t1 - t0 <= budget:
                    raise RuntimeError(f"request {seq.request_id}: the KV pools cannot hold its first chunk; "
                                       "raise EngineConfig.kv_memory_bytes")
                self.manager.free(seq)  # give back prefix-hit pages; retried next step
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.chunks.append(ScheduledChunk(seq, plan))
            budget -= t1 - t0
        return budget

    def commit(self, out: SchedulerOutput) -> None:
        """After the runner: let the cache manager key and release this step's pages (not those of a
        sequence that finished meanwhile: its pages were freed, see ``LLMEngine.abort``)."""
        for c in out.chunks:
            if c.seq.status is not Status.FINISHED and not c.drafts:  # a verify chunk commits after acceptance
                self.manager.commit(c.seq, c.plan)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Remove ``seq`` from wherever it is and free its pages."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.manager.free(seq)
        seq.status, seq.finish_reason = Status.FINISHED, reason
