"""The engine loop: add requests, step, report outputs; and its construction from a model.

Role: :class:`LLMEngine` owns the scheduler, the model runner and the tokenizer. ``step()``
= schedule → run → commit pages → sample → detokenize and check stops → outputs. It is
synchronous and single-threaded; :class:`~oscarkv.engine.llm.LLM` loops over it offline and
:class:`~oscarkv.engine.async_engine.AsyncEngine` drives it from a thread for servers.

Construction (:meth:`LLMEngine.from_hf`): the transformers model's weights are copied into a
:class:`~oscarkv.models.llama.PagedLM`, the KV codec is built from the
:class:`~oscarkv.config.KVConfig` (and the rotation artifact for ``oscar``, validated against
the model), the value rotation and mean are folded into the weights, and the pools are sized
from the memory budget. The start-up report gives capacity per tier and the BPE.
"""

from __future__ import annotations

import logging

import torch

from oscarkv.cache.kv_pools import KVPools, plan_pools
from oscarkv.cache.manager import KVCacheManager
from oscarkv.cache.page_pool import PagePool
from oscarkv.cache.seq_kv import ChunkSchedule
from oscarkv.config import EngineConfig
from oscarkv.engine import sampler
from oscarkv.engine.attention import AttentionBackend, LayerStorage
from oscarkv.engine.cuda_graphs import DEFAULT_BUCKETS
from oscarkv.engine.model_runner import ModelRunner, RunnerOutput
from oscarkv.engine.request import RequestOutput, SamplingParams
from oscarkv.engine.scheduler import Scheduler, SchedulerOutput
from oscarkv.engine.sequence import Sequence, Status
from oscarkv.engine.triton_backend import default_backend
from oscarkv.models.folding import fold_values
from oscarkv.models.llama import PagedLM
from oscarkv.quant.artifact import ModelFingerprint
from oscarkv.quant.codec import KVCodec, build_codec

log = logging.getLogger(__name__)


class LLMEngine:
    """Requests in, :class:`RequestOutput` s out, one ``step()`` at a time."""

    def __init__(self, runner: ModelRunner, codec: KVCodec, cfg: EngineConfig, tokenizer=None,
                 eos_token_ids: tuple[int, ...] = ()) -> None:
        self.runner, self.codec, self.cfg, self.tokenizer = runner, codec, cfg, tokenizer
        geo = runner.pools.geo
        self.manager = KVCacheManager(cfg.kv, PagePool(geo.bf16_pages),
                                      PagePool(geo.int2_pages) if geo.int2_pages else None,
                                      cfg.enable_prefix_caching)
        self.scheduler = Scheduler(cfg, self.manager)
        self.eos = tuple(eos_token_ids)
        self.seqs: dict[str, Sequence] = {}
        log.info("oscarkv engine: %s", self.describe())

    @classmethod
    def from_hf(cls, hf_model, cfg: EngineConfig, artifact=None, tokenizer=None,
                backend: AttentionBackend | None = None, cuda_graphs: bool = True) -> LLMEngine:
        """Build from a transformers model (see the module docstring); ``artifact`` for ``oscar``."""
        return cls.from_paged(PagedLM.from_hf(hf_model), cfg, artifact, tokenizer, backend, cuda_graphs)

    @classmethod
    def from_paged(cls, model: PagedLM, cfg: EngineConfig, artifact=None, tokenizer=None,
                   backend: AttentionBackend | None = None, cuda_graphs: bool = True) -> LLMEngine:
        """Build around a :class:`PagedLM` (folded in place). ``backend`` defaults to the device's
        (:func:`~oscarkv.engine.triton_backend.default_backend`); ``cuda_graphs`` captures decode
        steps per batch bucket on CUDA (:mod:`oscarkv.engine.cuda_graphs`)."""
        config = model.config
        fp = ModelFingerprint.from_config(config)
        if artifact is not None:
            artifact.validate(fp)
        codec = build_codec(cfg.kv, fp.num_layers, fp.num_kv_heads, fp.head_dim, artifact)
        dtype, device = next(model.parameters()).dtype, next(model.parameters()).device
        layers = [LayerStorage(layer.key, layer.value).to(device) for layer in codec.layers]
        values = fold_values(model, layers)
        storage = [LayerStorage(layer.key, v) for layer, v in zip(layers, values)]
        geo = plan_pools(cfg, fp.num_layers, fp.num_kv_heads, fp.head_dim, codec.group, dtype)
        backend = backend or default_backend(device)
        buckets = DEFAULT_BUCKETS if cuda_graphs and backend.decode_steps else ()
        runner = ModelRunner(model, KVPools(geo, device), storage, backend, buckets)
        return cls(runner, codec, cfg, tokenizer, _eos_ids(config, tokenizer))

    # ------------------------------------------------------------------------- reporting
    def describe(self) -> dict:
        """Capacity in tokens per tier, bytes per token per tier, and the BPE at full capacity."""
        geo = self.runner.pools.geo
        cap = geo.capacity()
        t = cap["bf16_tokens"] + cap["int2_tokens"] if geo.int2_pages else cap["bf16_tokens"]
        bpe = self.codec.bpe(t) if self.codec.quantized else 8.0 * geo.window_dtype.itemsize
        return {"method": self.cfg.kv.method, **cap, "bytes_per_token": geo.bytes_per_token(),
                "pool_bytes": self.runner.pools.nbytes(), "bpe_at_capacity": round(bpe, 4)}

    # ------------------------------------------------------------------------- requests
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    chunk_ends: tuple[int, ...] = ()) -> None:
        """Queue a request. ``chunk_ends``: explicit prefill chunk ends inside the prompt
        (default: multiples of ``EngineConfig.prefill_chunk``)."""
        if request_id in self.seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        ids = self.tokenizer(prompt).input_ids if isinstance(prompt, str) else list(prompt)
        schedule = ChunkSchedule(len(ids), self.cfg.prefill_chunk, tuple(sorted(chunk_ends)))
        for t0 in schedule.starts():
            if schedule.end(t0) - t0 > self.cfg.max_num_batched_tokens:
                raise ValueError(f"request {request_id}: chunk [{t0}, {schedule.end(t0)}) exceeds "
                                 f"max_num_batched_tokens={self.cfg.max_num_batched_tokens}")
        self.manager.check_schedule(schedule)
        seq = Sequence(request_id, ids, params, schedule, self.cfg.seed)
        self.seqs[request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now (its pages are freed); returns its final output."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return None
        self.scheduler.finish(seq, "abort")
        return seq.output()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # ------------------------------------------------------------------------- the step
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Run one step; outputs of the requests that got a token (or finished) in it."""
        out = self.scheduler.schedule()
        if not out.chunks:
            return []
        res = self.runner.run(out.chunks)
        self.scheduler.commit(out)
        self._record_prompt_logprobs(out, res)
        return self._sample(out, res)

    def _record_prompt_logprobs(self, out: SchedulerOutput, res: RunnerOutput) -> None:
        for i, hidden in res.prompt_hidden.items():
            seq, t0 = out.chunks[i].seq, out.chunks[i].plan.t0
            if len(seq.prompt_logprobs) > t0 + 1:  # already recorded before a preemption
                continue
            for lo in range(0, hidden.shape[0], 512):  # blocks: a long prompt's [T, V] logits would not fit
                logits = self.runner.model.compute_logits(hidden[lo:lo + 512])
                targets = seq.token_ids[t0 + lo + 1:t0 + lo + 1 + logits.shape[0]]
                seq.prompt_logprobs += sampler.prompt_logprobs(logits, targets, seq.params.prompt_logprobs)

    def _sample(self, out: SchedulerOutput, res: RunnerOutput) -> list[RequestOutput]:
        seqs = [c.seq for c in out.chunks if c.samples]
        if not seqs:
            return []
        tokens, logps = sampler.sample(res.sample_logits, [s.params for s in seqs], [s.generator for s in seqs])
        outputs = []
        for seq, tok, lp in zip(seqs, tokens, logps):
            seq.token_ids.append(tok)
            seq.logprobs.append(lp)
            reason = self._check_stop(seq, tok)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                self.seqs.pop(seq.request_id, None)
            outputs.append(seq.output(self._holdback(seq)))
        return outputs

    def _check_stop(self, seq: Sequence, tok: int) -> str | None:
        p = seq.params
        stopped = tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos)
        if self.tokenizer is not None:
            seq.text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=True)
            for s in p.stop:
                at = seq.text.find(s)
                if at >= 0:
                    seq.text = seq.text[:at]
                    return "stop"
        if stopped:
            return "stop"
        return "length" if len(seq.output_ids) >= p.max_tokens else None

    @staticmethod
    def _holdback(seq: Sequence) -> int:
        """Characters kept back from a stream: a possible stop-string prefix, an unfinished UTF-8 char."""
        n = max((len(s) - 1 for s in seq.params.stop), default=0)
        return n + (1 if seq.text.endswith("\ufffd") else 0)

    def status_of(self, request_id: str) -> Status | None:
        seq = self.seqs.get(request_id)
        return None if seq is None else seq.status


def _eos_ids(config, tokenizer) -> tuple[int, ...]:
    ids = getattr(config, "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(sorted(set(ids)))


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
