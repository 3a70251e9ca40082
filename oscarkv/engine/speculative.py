"""Speculative decoding over the paged cache: n-gram drafts, one verify step, exact acceptance.

Role: owned by the engine (``LLMEngine.spec``). The scheduler asks :meth:`SpeculativeDecoder.propose`
for drafts of a sequence's decode step (``ScheduledChunk.drafts``); the cache manager plans the step
to ``t0 + 1 + k`` tokens (``KVCacheManager.draft_end`` caps ``k``); the runner computes the chunk — alone in
its step and covered by an extend graph (``ExtendGraphs.verifies``: a long prefix, the Triton backend), as one
``1 + k``-token chunk through the split-K chunk kernel, which reads the cache once for all rows; otherwise as the
``1 + k`` one-token rows of :func:`verify_rows`, a batch of decode rows (they replay the decode graph of bucket
``1 + k``, each row reading the whole cache); :meth:`SpeculativeDecoder.accept` chooses the
emitted tokens from the rows' logits; the manager then truncates the plan to the accepted tokens
(``KVCacheManager.truncate``) before it is committed.

Correct by construction (what makes greedy outputs, and stored pages, those of a run without
speculation):

* Each row is a decode step of its own: row ``j`` (position ``t0 + j``) attends to the cache as
  stored at length ``t0 + j + 1`` — the prefix view of the step plus rows ``< j`` *as stored*
  (their BF16 slots, written earlier in the same layer) — and to itself as a decode step does. So
  an accepted token's K/V and logits are computed by the same function as without speculation (the
  rows only share the GEMMs of one batch, which changes rounding as a larger batch does). A verify chunk
  computes the same: its row ``j`` attends to the prefix as stored and to chunk rows ``<= j``, which the chunk
  kernel rounds to bf16 for its products — their BF16 slots' values (``ExtendGraphs.verifies`` asks for a
  backend whose decode steps read their own token as stored) — in another summation order.
* Drafts never change tiers: ``draft_end`` stops before a length that would demote a page, so the
  step demotes exactly what a one-token step demotes, and rolling back needs no INT2 change.
* Rejected rows leave nothing: ``truncate`` frees the pages only they used (taken from the free
  list, never by evicting a cached page), drops their slots, and keys only pages full of accepted
  tokens. Their K/V bytes sit in slots past the sequence's length, which every later token
  overwrites before anything reads them.

Acceptance: greedy — the longest prefix of drafts equal to the argmax, plus the argmax after it;
sampling — the standard rejection sampler for a point-mass draft: draft ``x`` is accepted with
probability ``p(x)`` (``p`` the request's processed distribution: temperature, top-k, top-p), else
the token is drawn from ``p`` with ``x`` removed (renormalized); after ``k`` acceptances a bonus
token is drawn from the last row. This keeps the output distribution exactly ``p`` per position.

Overlap (``LLMEngine``): drafts need the step's input token on the host, so a step is planned ahead of its
input (``Scheduler.schedule_ahead``) only while every sequence's :class:`DraftGate` is closed — text that does
not copy then decodes as fast as without speculation; a verify step is never planned ahead.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from oscarkv.cache.manager import WritePlan
from oscarkv.config import SpeculativeConfig
from oscarkv.engine.request import SamplingParams
from oscarkv.engine.sampler import filter_logits
from oscarkv.engine.scheduler import ScheduledChunk


class NgramIndex:
    """Prompt lookup over one sequence's tokens: the longest suffix of ``lo..hi`` tokens that occurred earlier with a
    token after it, at its last such occurrence. The tokens are mirrored into a growing array (each call copies only
    those added since the last) and a lookup scans it in C: the positions holding the last token, narrowed one token
    further back at a time. ~20 µs a lookup at 100K tokens on a slow CPU and no Python work per token, where a
    dictionary of every n-gram spent 0.19 s (and ~40 MB) indexing a 100K-token prompt at its first decode step."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.buf, self.size = np.empty(1024, np.int32), 0

    def _sync(self, tokens: list[int]) -> np.ndarray:
        """``tokens`` as an array view (the prefix mirrored earlier is assumed unchanged: sequences only grow)."""
        L = len(tokens)
        if L > self.buf.size:
            grown = np.empty(max(L, 2 * self.buf.size), np.int32)
            grown[:self.size] = self.buf[:self.size]
            self.buf = grown
        if L > self.size:
            self.buf[self.size:L] = tokens[self.size:L]
        self.size = L
        return self.buf[:L]

    def match(self, tokens: list[int]) -> int | None:
        """The position after the last earlier occurrence of the longest matching suffix (``lo..hi`` tokens), or
        ``None``: the drafts are the tokens from there."""
        a = self._sync(tokens)
        L, n, last = a.size, 0, -1
        ends = np.flatnonzero(a[:L - 1] == a[L - 1]) if L > 1 else a[:0]  # where earlier copies of the suffix end
        while ends.size:  # n: the suffix length matched so far, last: its latest earlier end
            n, last = n + 1, int(ends[-1])
            if n == self.hi:
                break
            ends = ends[ends >= n]
            ends = ends[a[ends - n] == a[L - 1 - n]]
        return last + 1 if n >= max(self.lo, 1) else None

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the last earlier occurrence of the longest matching suffix."""
        e = self.match(tokens)
        return [] if e is None else tokens[e:e + k]


@dataclass
class SpecStats:
    """Counters for ``/metrics`` and the benches."""

    decode_steps: int = 0  # sequence-steps that could speculate (one sampled decode step of one sequence)
    verify_steps: int = 0  # of them, those that verified at least one draft
    graph_steps: int = 0  # verify chunks computed as one chunk by an extend graph (the others: decode rows)
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens a sequence gains per decode step (1 without speculation)."""
        return (self.decode_steps + self.accepted) / self.decode_steps if self.decode_steps else 0.0


class DraftGate:
    """Whether one sequence drafts at its next decode step. Open: drafts are verified, and an exponential average of
    the drafts a verify step accepts (a lookup that finds nothing counts as none) below
    ``SpeculativeConfig.min_accepted_tokens`` closes it (a count, not a share: a verify step of 9 rows costs about
    what one of 5 does). Closed (also at first): every step's *shadow* draft — what it
    would have proposed — is judged on its own against the tokens the sequence then emits (free: greedy verification
    accepts exactly the drafts' prefix equal to those tokens; sampling, each with the probability its token is
    drawn), and one judged at the floor or better reopens it. So text that does not copy pays no verify step (its
    steps run ahead), and text that starts copying opens the gate within a token or two. Outputs never depend on
    it (drafts only change how many tokens a step emits). Development set: ``lab/scripts/draft_gate_sim.py``."""

    DECAY = 0.5

    def __init__(self, floor: float) -> None:
        self.floor, self.rate = floor, 0.0
        self.shadows: list[tuple[int, list[int]]] = []  # (token count it was drafted at, drafts), oldest first
        self.seen = -1  # the token count the shadows were last brought to

    def is_open(self) -> bool:
        return self.rate >= self.floor

    def score(self, accepted: int, drafted: int) -> float:
        """What one verify step (or shadow draft) counts toward the average: its accepted drafts."""
        return accepted

    def update(self, drafted: int, accepted: int) -> None:
        self.rate = self.DECAY * self.rate + (1 - self.DECAY) * self.score(accepted, drafted)

    def watch(self, tokens: list[int], index: NgramIndex, k: int) -> None:
        """While closed: judge the pending shadow drafts (one per token count seen) whose outcome is certain on the
        tokens known now, oldest first, then draft anew from them; a no-op when no token arrived since the last call."""
        n = len(tokens)
        if self.is_open():
            self.shadows, self.seen = [], -1
            return
        if n == self.seen:
            return
        while self.shadows:
            at, drafts = self.shadows[0]
            got = tokens[at:at + len(drafts)]
            a = next((j for j, (x, y) in enumerate(zip(drafts, got)) if x != y), len(got))
            if a == len(got) < len(drafts) and self.score(a, len(drafts)) < self.floor:
                break  # every token so far agrees, too few yet to reopen: wait for the rest
            self.shadows.pop(0)
            self.rate = self.score(a, len(drafts))  # NOTE: while closed each shadow is judged on its own, not averaged
        if self.is_open():
            return
        self.seen, drafts = n, index.propose(tokens, k)
        if drafts:
            self.shadows.append((n, drafts))


class StepCosts:
    """The wall time of an engine's verify steps, of its plain decode steps run ahead (``plain``: overlap) and of those
    not (``cold``: the step after a verify step, or every step without overlap), as averages (the mean of the first,
    then exponential), and the draft floor they imply (``SpeculativeConfig.measured_floor``)."""

    DECAY, WARM = 0.9, 4

    def __init__(self) -> None:
        self.mean = {"verify": 0.0, "plain": 0.0, "cold": 0.0}
        self.count = {"verify": 0, "plain": 0, "cold": 0}

    def observe(self, kind: str | None, seconds: float) -> None:
        """One step of ``kind`` (:func:`step_kind`; ``None``: neither, not counted) took ``seconds``."""
        if kind is None:
            return
        n = self.count[kind] = self.count[kind] + 1
        d = min(self.DECAY, 1 - 1 / n)
        self.mean[kind] = d * self.mean[kind] + (1 - d) * seconds

    def floor(self, prior: float, k: int) -> float:
        """The accepted drafts at which a verify step breaks even: with them it emits one more token than it accepts
        at the cost of itself and of the cold step after it, against as many plain steps, so (verify + cold) / plain
        − 2, within ``[0, k]`` (where one plain kind is not warm, the other stands in for it: verify / plain − 1);
        ``prior`` until verify steps and a plain kind are warm."""
        warm = [kind for kind in ("plain", "cold") if self.count[kind] >= self.WARM and self.mean[kind] > 0]
        if self.count["verify"] < self.WARM or not warm:
            return prior
        plain, cold = self.mean[warm[0]], self.mean[warm[-1]]
        return min(float(k), max(0.0, (self.mean["verify"] + cold) / plain - 2))


def step_kind(chunks: list[ScheduledChunk], ahead: bool = True) -> str | None:
    """``verify`` (a chunk with drafts), ``plain`` (every chunk one decode token; ``cold`` if the step was not launched
    ahead) or ``None`` (prefill in it)."""
    if any(c.drafts for c in chunks):
        return "verify"
    if all(c.samples and c.plan.t1 - c.plan.t0 == 1 for c in chunks):
        return "plain" if ahead else "cold"
    return None


class SpeculativeDecoder:
    """Drafts (``ngram``), verify rows and acceptance for one engine (see the module docstring)."""

    def __init__(self, cfg: SpeculativeConfig) -> None:
        self.cfg, self.stats, self.costs = cfg, SpecStats(), StepCosts()
        self._index: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Sequence -> NgramIndex
        self._gate: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Sequence -> DraftGate

    def floor(self) -> float:
        """The gates' floor now: ``min_accepted_tokens``, or measured (``measured_floor``: :class:`StepCosts`)."""
        prior = self.cfg.min_accepted_tokens
        return self.costs.floor(prior, self.cfg.num_speculative_tokens) if self.cfg.measured_floor else prior

    def _watched(self, seq) -> DraftGate:
        """``seq``'s gate (at the floor of now), its shadow drafts brought up to the tokens known now."""
        gate, index, floor = self._gate.get(seq), self._index.get(seq), self.floor()
        if gate is None:
            gate = self._gate[seq] = DraftGate(floor)
        gate.floor = floor
        if index is None:
            index = self._index[seq] = NgramIndex(self.cfg.prompt_lookup_min, self.cfg.prompt_lookup_max)
        gate.watch(seq.token_ids, index, self.cfg.num_speculative_tokens)
        return gate

    def propose(self, seq, limit: int) -> list[int]:
        """At most ``min(limit, K)`` drafts for ``seq``'s next decode step (none while its gate is closed)."""
        self.stats.decode_steps += 1
        k = min(limit, self.cfg.num_speculative_tokens)
        if k <= 0 or not (gate := self._watched(seq)).is_open():
            return []
        drafts = self._index[seq].propose(seq.token_ids, k)
        if not drafts:  # NOTE: no draft is a miss for the gate (else text that never repeats loses overlap)
            gate.update(1, 0)
        return drafts

    def drafts_next(self, seq) -> bool:
        """Whether ``seq``'s next decode step may draft (its gate, brought up to the tokens known now, is open):
        if none of a step's sequences may, the engine plans the next step ahead (overlap), without asking
        :meth:`propose`."""
        return self._watched(seq).is_open()

    def skip(self, seq) -> None:
        """``seq``'s decode step planned ahead, without drafts (its gate closed: :meth:`drafts_next`)."""
        self.stats.decode_steps += 1

    def accept(self, logits: torch.Tensor, drafts: list[int], params: SamplingParams,
               generator: torch.Generator | None, seq=None, greedy: torch.Tensor | None = None
               ) -> tuple[list[int], list[float]]:
        """Emitted tokens (accepted drafts, then one more) and their log-probabilities from the rows'
        ``logits [1 + k, V]`` (``greedy``: their :func:`greedy_pair`, if the step formed it); ``seq``'s draft
        gate learns the acceptance."""
        k = len(drafts)
        if params.greedy:
            # NOTE: every emitted token is its row's argmax, so one device-to-host copy brings tokens and log-probs
            host = _host_rows(greedy if greedy is not None else greedy_pair(logits))
            best, logp = [int(b) for b in host[0]], host[1]
            a = next((j for j in range(k) if drafts[j] != best[j]), k)
            tokens, logp = drafts[:a] + [best[a]], logp[:a + 1]
        else:
            tokens = rejection_sample(filter_logits(logits, [params] * (k + 1)).softmax(-1), drafts, generator)
            rows = torch.arange(len(tokens), device=logits.device)
            logp = torch.log_softmax(logits, -1)[rows, torch.tensor(tokens, device=logits.device)].tolist()
        self.stats.verify_steps += 1
        self.stats.drafted += k
        self.stats.accepted += len(tokens) - 1
        if seq is not None and seq in self._gate:
            self._gate[seq].update(k, len(tokens) - 1)
        return tokens, logp


def greedy_pair(logits: torch.Tensor) -> torch.Tensor:
    """``[2, R]`` fp32: each row's argmax of ``logits [R, V]`` (the decode sampler's choice; ids < 2^24 are exact
    in fp32) and its log-probability — a greedy verify step's tokens and log-probs in one host copy. An extend
    graph of a speculating engine forms it inside the graph and copies it to pinned memory (``ExtendGraphs(greedy=
    True)``): the ~6 launches and the copy after the replay cost a verify step ~0.2-0.35 ms of host time with the
    GPU idle (H200 host, 2026-11-29, ``lab.scripts.verify_host``)."""
    best = logits.argmax(-1)
    return torch.stack([best.float(), torch.log_softmax(logits.float(), -1).gather(1, best[:, None])[:, 0]])


def _host_rows(pair: torch.Tensor) -> list[list[float]]:
    """``pair`` as lists; a pinned one (an extend graph copied it out itself) after the replay's stream finished."""
    if pair.device.type == "cpu" and pair.is_pinned():
        torch.cuda.current_stream().synchronize()
    return pair.tolist()


def rejection_sample(probs: torch.Tensor, drafts: list[int], generator: torch.Generator | None) -> list[int]:
    """Tokens for rows ``probs [1 + k, V]`` (each a distribution) and point-mass drafts ``[k]``: draft ``j``
    is accepted with probability ``probs[j, x]``; the first rejection draws from ``probs[j]`` without
    ``x``; all accepted: a bonus draw from ``probs[k]``."""
    dev = probs.device
    u = torch.rand(len(drafts), generator=generator, device=dev).tolist()
    p_draft = probs[torch.arange(len(drafts)), torch.tensor(drafts, dtype=torch.int64, device=dev)].tolist()
    for j, x in enumerate(drafts):
        if u[j] >= p_draft[j]:
            rest = probs[j].clone()
            rest[x] = 0.0
            return drafts[:j] + [int(torch.multinomial(rest / rest.sum(), 1, generator=generator))]
    return drafts + [int(torch.multinomial(probs[len(drafts)], 1, generator=generator))]


def verify_rows(chunk: ScheduledChunk, page_size: int) -> list[ScheduledChunk]:
    """The ``1 + k`` one-token rows of a verify chunk: row ``j`` a decode step at ``t0 + j`` whose view is
    the chunk's prefix view plus rows ``< j`` (as stored: their slots follow the view in table order, as
    in ``ModelRunner.decode_view``). The step's demotions ride on row 0; every row samples."""
    plan, rows = chunk.plan, []
    pages, n = list(plan.view_bf16), plan.view_bf16_len
    for j, slot in enumerate(plan.slots):
        row = WritePlan(plan.t0 + j, plan.t0 + j + 1, [slot], view_bf16=list(pages), view_bf16_len=n,
                        view_int2=plan.view_int2)
        if j == 0:
            row.demote_src, row.demote_dst = plan.demote_src, plan.demote_dst
        page, off = divmod(slot, page_size)
        if off == 0:
            pages.append(page)
        n += 1
        rows.append(ScheduledChunk(chunk.seq, row))
        rows[-1].samples = True
    return rows
