"""The engine loop: add requests, step, report outputs; and its construction from a model.

Role: :class:`LLMEngine` owns the scheduler, the runner (any :class:`~oscarkv.engine.runner.Runner`,
given at construction and never replaced) and the tokenizer. A request is checked once
(:meth:`LLMEngine.validate`, :mod:`oscarkv.engine.admission`) and queued as a
:class:`~oscarkv.engine.admission.ValidRequest` (:meth:`LLMEngine.add`). ``step()``
= schedule → run → commit pages → sample → detokenize (incrementally,
:mod:`oscarkv.engine.detokenizer`) and check stops → outputs. It is
single-threaded; :class:`~oscarkv.llm.LLM` loops over it offline and
:class:`~oscarkv.engine.async_engine.AsyncEngine` drives it from a thread for servers.

Overlap (``EngineConfig.overlap``, on for CUDA): a decode step's tokens stay on the
device (:class:`~oscarkv.engine.sampler.DeviceTokens`), and before waiting for them ``step()``
plans and launches the next decode step (:meth:`Scheduler.schedule_ahead`), which reads them
there (:class:`~oscarkv.engine.model_runner.PendingIds`). The host's work for one step then
runs while the device computes the next, and each ``step()`` still returns one step's outputs.
A sequence that stops in a step (EOS, a stop string) has a row in the step launched ahead of
it; the row is discarded and the sequence's pages are freed as usual (the plan of that step
is abandoned). The outputs are those of an engine without overlap, except that such a kept
row can change the batch the other rows' matmuls run in (rounding, not what they compute).

Construction (:meth:`LLMEngine.from_hf`): the transformers model's weights are copied into a
:class:`~oscarkv.models.llama.PagedLM`, the KV codec is built from the
:class:`~oscarkv.config.KVConfig` (and the rotation artifact for ``oscar``, validated against
the model), the value rotation and mean are folded into the weights, and the pools are sized
from the memory budget. The start-up report gives capacity per tier and the BPE.
"""

from __future__ import annotations

import dataclasses

import logging
import time
from dataclasses import dataclass

import torch

from oscarkv.cache.manager import KVCacheManager
from oscarkv.cache.page_pool import PagePool
from oscarkv.cache.window import WindowCache
from oscarkv.config import EngineConfig
from oscarkv.engine import sampler
from oscarkv.attention.step import AttentionBackend
from oscarkv.engine.admission import Admission, LineStarts, ValidRequest, turn_marker
from oscarkv.engine.assembly import build_runner_and_codec, eos_ids
from oscarkv.engine.detokenizer import Detokenizer, IncrementalText
from oscarkv.engine.token_memo import TokenMemo
from oscarkv.engine.model_runner import PendingIds, RunnerOutput
from oscarkv.engine.request import RequestOutput, SamplingParams
from oscarkv.engine.runner import Runner
from oscarkv.engine.scheduler import Scheduler, SchedulerOutput
from oscarkv.engine import speculative
from oscarkv.engine.speculative import SpeculativeDecoder
from oscarkv.engine.sequence import PENDING, Sequence, Status
from oscarkv.engine.stats import EngineStats, TierStats
from oscarkv.models.llama import PagedLM
from oscarkv.quant.codec import KVCodec

log = logging.getLogger(__name__)


@dataclass
class _Step:
    """A launched step: its schedule, the runner's output and its tokens on the device (``None`` if
    the launch raised ``error``, or nothing samples)."""

    out: SchedulerOutput
    res: RunnerOutput | None = None
    tokens: sampler.DeviceTokens | None = None
    error: Exception | None = None
    verify_logits: torch.Tensor | None = None  # [rows, V] of the verify chunks (after the others), speculation only
    verify_greedy: torch.Tensor | None = None  # [2, rows]: their greedy_pair, where the step formed it


class LLMEngine:
    """Requests in, :class:`RequestOutput` s out, one ``step()`` at a time."""

    def __init__(self, runner: Runner, codec: KVCodec, cfg: EngineConfig, tokenizer=None,
                 eos_token_ids: tuple[int, ...] = ()) -> None:
        self.runner, self.codec, self.cfg, self.tokenizer = runner, codec, cfg, tokenizer
        self.detokenizer = Detokenizer(tokenizer) if tokenizer is not None else None
        self.tokens = TokenMemo(tokenizer) if tokenizer is not None else None  # text prompts' ids (follow-up turns)
        geo = runner.pools.geo
        window = WindowCache(codec.sliding, cfg.kv.page_size, PagePool(geo.window_pages)) if codec.sliding else None
        self.manager = KVCacheManager(cfg.kv, PagePool(geo.bf16_pages),
                                      PagePool(geo.int2_pages) if geo.int2_pages else None,
                                      cfg.enable_prefix_caching, window)
        self.spec = SpeculativeDecoder(cfg.speculative) if cfg.speculative.enabled else None
        self.scheduler = Scheduler(cfg, self.manager, self.spec.propose if self.spec else None)
        resume = cfg.enable_prefix_caching and tokenizer is not None
        self.admission = Admission(cfg, self.manager, self.max_model_len,
                                   turn_marker(tokenizer) if resume and cfg.resume_turns else (),
                                   LineStarts.of(tokenizer) if resume and cfg.resume_questions else None)
        self.eos = tuple(eos_token_ids)
        self.seqs: dict[str, Sequence] = {}
        self.num_prompt_tokens = 0  # statistics: prompt tokens of added requests ...
        self.num_generated_tokens = 0  # ... and tokens sampled
        self.overlap = cfg.overlap if cfg.overlap is not None else runner.device.type == "cuda"
        self._ahead: _Step | None = None  # the step launched ahead (overlap), finished by the next step()
        self.num_ahead_steps = 0  # statistics: steps launched ahead
        log.info("oscarkv engine: %s", self.describe())

    @classmethod
    def from_hf(cls, hf_model, cfg: EngineConfig, artifact=None, tokenizer=None,
                backend: AttentionBackend | None = None, cuda_graphs: bool = True,
                device: torch.device | None = None) -> LLMEngine:
        """Build from a transformers model (see the module docstring); ``artifact`` for ``oscar``."""
        return cls.from_paged(PagedLM.from_hf(hf_model), cfg, artifact, tokenizer, backend, cuda_graphs, device)

    @classmethod
    def from_paged(cls, model: PagedLM, cfg: EngineConfig, artifact=None, tokenizer=None,
                   backend: AttentionBackend | None = None, cuda_graphs: bool = True,
                   device: torch.device | None = None) -> LLMEngine:
        """Build around a :class:`PagedLM` (folded in place; with ``cfg.tensor_parallel_size > 1`` left
        whole: each rank folds its shard, :mod:`oscarkv.engine.workers`). ``backend`` defaults to the
        device's (:func:`~oscarkv.attention.backends.default_backend`); ``cuda_graphs`` captures decode
        steps per batch bucket on CUDA (:mod:`oscarkv.engine.cuda_graphs`). ``device``: where tensor-parallel
        ranks run (rank 0's device; default: the model's), so that a model larger than one GPU can stay on
        the host; a single-device engine runs where the model is."""
        runner, codec = build_runner_and_codec(model, cfg, artifact, backend, cuda_graphs, device)
        return cls(runner, codec, cfg, tokenizer, eos_ids(model.config, tokenizer))

    # ------------------------------------------------------------------------- reporting
    def describe(self) -> dict:
        """Capacity in tokens per tier, bytes per token per tier, and the BPE at full capacity; bytes are
        the whole tensor-parallel group's (every rank holds every token for its KV heads, a replicated
        head once per rank that stores it)."""
        geo, n = self.runner.pools.geo, self.runner.tp.size
        cap = geo.capacity()
        t = cap["bf16_tokens"] + cap["int2_tokens"] if geo.int2_pages else cap["bf16_tokens"]
        window = {"window_layers": geo.window_layers, "window_pages": geo.window_pages - 1} if geo.window_layers else {}
        return {"method": self.cfg.kv.method, "tensor_parallel_size": n, **cap, **window,
                "bytes_per_token": {k: v * n for k, v in geo.bytes_per_token().items()},
                "pool_bytes": {k: v * n for k, v in self.runner.pools.nbytes().items()},
                "bpe_at_capacity": round(self.bpe(t), 4)}

    def bpe(self, num_tokens: int) -> float:
        """Bits per stored KV element of a ``num_tokens``-token sequence: the codec's tier mix for a
        quantized cache (with the sliding layers' BF16 windows, :meth:`KVCodec.bpe`), else the width of
        the dtype the pools store (32 for an fp32 model)."""
        if self.codec.quantized:
            return self.codec.bpe(num_tokens)
        return 8.0 * self.runner.pools.geo.window_dtype.itemsize

    @property
    def max_pool_tokens(self) -> int:
        """Longest sequence the KV pools hold on their own: BF16 pages for ``kv=bf16``; else INT2
        history pages plus the BF16 sink and recent window (the BF16 pool is sized for windows)."""
        cap, kv = self.runner.pools.geo.capacity(), self.cfg.kv
        if not self.manager.quantized:
            return cap["bf16_tokens"]
        return min(cap["int2_tokens"] + kv.sink + kv.recent, cap["bf16_tokens"] + cap["int2_tokens"])

    @property
    def vocab_size(self) -> int:
        """Rows of the model's logits."""
        return self.runner.model.config.vocab_size

    def stats(self) -> EngineStats:
        """Pages used and free per tier, prefix-cache hit rate, queue, tokens generated."""
        geo, manager, sched, n = self.runner.pools.geo, self.manager, self.scheduler, self.runner.tp.size
        cap = geo.capacity()
        tiers = {"bf16": TierStats(manager.bf16.num_used, manager.bf16.num_pages - 1, cap["bf16_tokens"],
                                   geo.bf16_page_bytes() * n)}  # a page id names one page on every rank
        if manager.int2 is not None:
            tiers["int2"] = TierStats(manager.int2.num_used, manager.int2.num_pages - 1, cap["int2_tokens"],
                                      geo.int2_page_bytes() * n)
        if manager.window is not None:
            pool = manager.window.pool
            tiers["window"] = TierStats(pool.num_used, pool.num_pages - 1, (pool.num_pages - 1) * geo.page_size,
                                        geo.window_page_bytes(), 2 * geo.window_layers * geo.num_kv_heads * geo.head_dim)
        return EngineStats(tiers, 2 * geo.num_layers * geo.num_kv_heads * n * geo.head_dim,
                           self.describe()["bpe_at_capacity"], manager.hit_tokens, self.num_prompt_tokens,
                           self.num_generated_tokens, sched.num_preemptions, len(sched.waiting), len(sched.running),
                           self.num_ahead_steps, dataclasses.replace(self.spec.stats) if self.spec else None,
                           self.tokens.reused if self.tokens else 0)

    # ------------------------------------------------------------------------- requests
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    chunk_ends: tuple[int, ...] = (), resume: tuple[int, ...] = ()) -> None:
        """Validate and queue a request (``ValueError`` if refused, :meth:`validate`). ``chunk_ends``: explicit
        prefill chunk ends inside the prompt (default: multiples of ``EngineConfig.prefill_chunk``); ``resume``:
        where earlier requests' prompts ended inside this one (a follow-up turn on a cached document), so that their
        cached last chunks are hits (``Admission.validate``)."""
        self.add(self.validate(request_id, prompt, params, chunk_ends, resume))

    def validate(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                 chunk_ends: tuple[int, ...] = (), resume: tuple[int, ...] = ()) -> ValidRequest:
        """Tokenize a text prompt and check the request (:class:`~oscarkv.engine.admission.Admission`): the
        :class:`ValidRequest` that :meth:`add` queues, or ``ValueError`` naming the numbers. Safe from another
        thread than the one that steps the engine (a server validates before its response starts)."""
        ids = self.tokens.encode(prompt) if isinstance(prompt, str) else prompt
        return self.admission.validate(request_id, ids, params, chunk_ends, resume)

    def add(self, request: ValidRequest) -> None:
        """Queue a validated request (checked again only for a request id already in use: ``ValueError``)."""
        if request.request_id in self.seqs:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        params = request.params
        detok = IncrementalText(self.detokenizer, params.stop) if self.detokenizer is not None else None
        seq = Sequence(request.request_id, request.prompt_ids, params, request.schedule, self.cfg.seed,
                       self.runner.device, detok)
        seq.kv.keys = list(request.page_keys)
        self.seqs[request.request_id] = seq
        self.scheduler.add(seq)
        self.num_prompt_tokens += len(request.prompt_ids)

    @property
    def max_model_len(self) -> int | None:
        """The model's positions (``max_position_embeddings``); ``None`` if its config has none."""
        return getattr(self.runner.model.config, "max_position_embeddings", None)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now (its pages are freed); returns its final output."""
        seq = self.seqs.get(request_id)
        if seq is None:
            return None
        self._finish_seq(seq, "abort")
        return seq.output()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self._ahead is not None

    def _finish_seq(self, seq: Sequence, reason: str) -> None:
        """Finish ``seq`` and free its pages, those its row in the step launched ahead took included
        (and the ``PENDING`` input of that row, if this step failed before its token arrived)."""
        for c in self._ahead.out.chunks if self._ahead is not None else ():
            if c.seq is seq:
                self.manager.abandon(c.plan)
                if seq.token_ids[-1] == PENDING:
                    seq.token_ids.pop()
        self.scheduler.finish(seq, reason)
        self.seqs.pop(seq.request_id, None)

    # ------------------------------------------------------------------------- the step
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Run one step; outputs of the requests that got a token (or finished) in it. With overlap
        (module docstring) the step finished here may have been launched by the previous call, and
        the next one may be launched before this returns.

        If the model or the sampler raises, every request of this step finishes with reason
        ``error`` (its output's ``error`` says why; the traceback is logged) and its pages are
        freed; other requests and later steps are unaffected. An exception from the scheduler
        itself is a bug and propagates."""
        t, (cur, self._ahead) = time.perf_counter(), (self._ahead, None)
        ahead = cur is not None
        if cur is None:
            out = self.scheduler.schedule()
            if not out.chunks:
                return []
            cur = self._launch(out)
        if self.overlap and cur.error is None:
            self._ahead = self._launch_ahead(cur)
        kind = speculative.step_kind(cur.out.chunks, ahead) if self.spec is not None and cur.error is None else None
        done = self._complete(cur)
        if kind is not None:
            self.spec.costs.observe(kind, time.perf_counter() - t)  # NOTE: measured_floor's step times
        return done

    @torch.inference_mode()
    def drain(self) -> list[RequestOutput]:
        """Finish the step launched ahead, if any, without launching another; its outputs (the next
        ``step()`` schedules afresh)."""
        cur, self._ahead = self._ahead, None
        return [] if cur is None else self._complete(cur)

    def _launch(self, out: SchedulerOutput, pending: PendingIds | None = None) -> _Step:
        """Run the model for ``out`` and choose its tokens, on the device (asynchronously on a GPU)."""
        step = _Step(out)
        try:
            if any(c.drafts for c in out.chunks):
                step.res, step.verify_logits, step.verify_greedy = self._run_verify(out)
            else:
                step.res = self.runner.run(out.chunks, pending)
            seqs = [c.seq for c in out.chunks if c.samples and not c.drafts]
            if seqs:
                step.tokens = sampler.DeviceTokens(step.res.sample_logits[:len(seqs)], [s.params for s in seqs],
                                                   [s.generator for s in seqs])
        except Exception as e:
            step.error = e
        return step

    def _run_verify(self, out: SchedulerOutput) -> tuple[RunnerOutput, torch.Tensor, torch.Tensor | None]:
        """Run a step with verify chunks (``oscarkv.engine.speculative``): they go last (``out.chunks`` is
        reordered), each as ``1 + k`` one-token rows — or, alone in its step and covered by an extend graph
        (``ExtendGraphs.verifies``), as one chunk; the logits of the other chunks, then of every row, and
        those rows' ``greedy_pair`` where the graph formed it."""
        out.chunks = [c for c in out.chunks if not c.drafts] + [c for c in out.chunks if c.drafts]
        graphs = self.runner.extend_graphs
        if graphs is not None and graphs.verifies([c.plan for c in out.chunks]):
            rows = out.chunks  # one verify chunk, replayed as an extend graph (its logits: every row)
            self.spec.stats.graph_steps += 1
        else:
            rows = [r for c in out.chunks
                    for r in (speculative.verify_rows(c, self.cfg.kv.page_size) if c.drafts else [c])]
        verify = [c for c in out.chunks if c.drafts]
        for c in verify:  # NOTE: the drafts sit in token_ids only while the runner reads the step's ids
            c.seq.token_ids += c.drafts
        try:
            res = self.runner.run(rows)
        finally:
            for c in verify:
                del c.seq.token_ids[len(c.seq.token_ids) - len(c.drafts):]
        n = sum(c.samples for c in out.chunks) - len(verify)
        return res, res.sample_logits[n:], None if res.greedy is None else res.greedy[:, n:]

    def _accept(self, cur: _Step) -> list[RequestOutput]:
        """Choose each verify chunk's tokens, truncate its plan to what they store, commit it, check stops.
        A token after a stop is dropped as if never sampled: the step stores the K/V of the kept tokens but
        the last (as a decode step stores its input, not the token it samples)."""
        outputs, row = [], 0
        for c in (c for c in cur.out.chunks if c.drafts):
            rows, row = slice(row, row + len(c.drafts) + 1), row + len(c.drafts) + 1
            seq, pair = c.seq, None if cur.verify_greedy is None else cur.verify_greedy[:, rows]
            if seq.status is Status.FINISHED:
                continue
            tokens, logps = self.spec.accept(cur.verify_logits[rows], c.drafts, seq.params, seq.generator, seq, pair)
            reason, kept = None, 0
            for tok, lp in zip(tokens, logps):
                seq.token_ids.append(tok)
                seq.logprobs.append(lp)
                self.num_generated_tokens, kept = self.num_generated_tokens + 1, kept + 1
                if (reason := self._check_stop(seq, tok)) is not None:
                    break
            self.manager.truncate(seq, c.plan, c.plan.t0 + kept)
            self.manager.commit(seq, c.plan)
            c.drafts = []  # committed: a failure after this must not abandon the plan
            if reason is not None:
                self._finish_seq(seq, reason)
            outputs.append(seq.output())
        return outputs

    def _launch_ahead(self, cur: _Step) -> _Step | None:
        """The decode step after ``cur``, launched before ``cur``'s tokens reach the host; ``None`` if
        ``cur`` is not a decode step or the scheduler declines (``Scheduler.schedule_ahead``)."""
        chunks = cur.out.chunks
        if cur.tokens is None or not all(c.samples and c.plan.t1 - c.plan.t0 == 1 for c in chunks):
            return None
        continuing = [c.seq for c in chunks if c.seq.status is Status.RUNNING
                      and len(c.seq.output_ids) + 1 < c.seq.params.max_tokens]
        if self.spec is not None and any(map(self.spec.drafts_next, continuing)):
            return None  # it may draft: drafts need its input token on the host
        out = self.scheduler.schedule_ahead(cur.out, continuing) if continuing else None
        if out is None:
            return None
        for c in out.chunks if self.spec is not None else ():
            self.spec.skip(c.seq)
        row = {id(c.seq): i for i, c in enumerate(chunks)}
        self.num_ahead_steps += 1
        return self._launch(out, PendingIds(cur.tokens.tokens, [row[id(c.seq)] for c in out.chunks]))

    def _complete(self, cur: _Step) -> list[RequestOutput]:
        """Commit ``cur``'s pages, collect its tokens from the device, check stops: its outputs."""
        gone = {id(c.seq) for c in cur.out.chunks if c.seq.status is Status.FINISHED}  # since it was launched ahead
        if cur.error is not None:
            return self._fail(cur.out, cur.error, False, gone)
        self.scheduler.commit(cur.out)
        try:
            self._record_prompt_logprobs(cur.out, cur.res)
            return self._sample(cur) + (self._accept(cur) if cur.verify_logits is not None else [])
        except Exception as e:
            for c in cur.out.chunks:  # verify chunks not yet committed
                if c.drafts and c.seq.status is not Status.FINISHED:
                    self.manager.abandon(c.plan)
            return self._fail(cur.out, e, True, gone)

    def _fail(self, out: SchedulerOutput, exc: Exception, committed: bool, gone: set[int]) -> list[RequestOutput]:
        """Finish the step's requests with reason ``error`` (see :meth:`step`), except those in ``gone``
        (ids of sequences that finished before the step completed: their pages and outputs are done)."""
        log.error("engine step failed; failing its %d requests", len(out.chunks) - len(gone), exc_info=exc)
        outputs = []
        for c in out.chunks:
            if id(c.seq) in gone:
                continue
            if not committed:
                self.manager.abandon(c.plan)
            if c.seq.status is not Status.FINISHED:  # else it finished earlier in this step
                c.seq.error = f"{type(exc).__name__}: {exc}"
                self._finish_seq(c.seq, "error")
            outputs.append(c.seq.output())
        return outputs

    def _record_prompt_logprobs(self, out: SchedulerOutput, res: RunnerOutput) -> None:
        for i, hidden in res.prompt_hidden.items():
            seq, t0 = out.chunks[i].seq, out.chunks[i].plan.t0
            if len(seq.prompt_logprobs) > t0 + 1:  # already recorded before a preemption
                continue
            for lo in range(0, hidden.shape[0], 512):  # blocks: a long prompt's [T, V] logits would not fit
                logits = self.runner.model.compute_logits(hidden[lo:lo + 512])
                targets = seq.token_ids[t0 + lo + 1:t0 + lo + 1 + logits.shape[0]]
                seq.prompt_logprobs += sampler.prompt_logprobs(logits, targets, seq.params.prompt_logprobs)

    def _sample(self, cur: _Step) -> list[RequestOutput]:
        chunks = [c for c in cur.out.chunks if c.samples and not c.drafts]
        if not chunks:
            return []
        tokens, logps = cur.tokens.result()
        outputs = []
        for c, tok, lp in zip(chunks, tokens, logps):
            seq = c.seq
            if seq.status is Status.FINISHED:  # aborted, or stopped in the step before this one ran ahead
                continue
            if len(seq.token_ids) > c.plan.t1:
                seq.token_ids[c.plan.t1] = tok  # the PENDING input of the step launched ahead
            else:
                seq.token_ids.append(tok)
            seq.logprobs.append(lp)
            self.num_generated_tokens += 1
            reason = self._check_stop(seq, tok)
            if reason is not None:
                self._finish_seq(seq, reason)
            outputs.append(seq.output())
        return outputs

    def _check_stop(self, seq: Sequence, tok: int) -> str | None:
        p = seq.params
        if seq.detok is not None and seq.detok.add(tok):
            return "stop"
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos):
            return "stop"
        return "length" if len(seq.output_ids) >= p.max_tokens else None

    def close(self) -> None:
        """Stop the tensor-parallel worker processes, if any (the engine runs no steps afterwards)."""
        self.runner.close()

    def failure(self) -> str | None:
        """Why the engine can run no more steps — a tensor-parallel rank died (every request then fails with
        this error) — or ``None``."""
        return self.runner.failure()

    def status_of(self, request_id: str) -> Status | None:
        seq = self.seqs.get(request_id)
        return None if seq is None else seq.status
