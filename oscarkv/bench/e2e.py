"""Shared pieces of the end-to-end GPU benchmarks (``oscarkv bench decode`` / ``capacity``).

Role: build an engine around a random-weight model at a real shape
(:func:`oscarkv.models.shapes.shape_config`, bf16 weights, Triton backend, CUDA graphs), and
**fill long prompts fast**: :func:`drive` runs requests to completion through the engine's own
scheduler, cache manager and ``step()`` (overlap included), but a prefill chunk that samples
nothing is not run through the model — random K/V (standard normal, stored domain) are written into its slots through the
backend's write path (``TritonAttention.write``, the Triton write kernel) and its demotions
through ``TritonAttention.demote_all`` (the Triton encoder, every layer at once). Each prompt's last
chunk is one token (``chunk_ends = (n - 1,)``), so the first sampled token and every later one
come from real decode steps (the decode kernel, CUDA graphs). Decode speed does not depend on
the cached values, only on their tiers, which the manager sets exactly as for a real prefill.

Every bench engine is built (:func:`build_engine`) around a :class:`BenchRunner`: a
:class:`~oscarkv.engine.runner.Runner` around the real one (a ``ModelRunner``, or a ``ParallelRunner``
with tensor parallelism), given to the engine at construction. It records every launch
(:class:`Launch`: decode step or not, by the chunks' shape; chunks run through the model; chunks
filled) and fills while :func:`drive` runs (``BenchRunner.filling``); nothing replaces
``engine.runner``. NOTE: :func:`fill` writes through the runner's backend and pools, and
:func:`kv_read_bytes` reads the pool geometry and each sequence's tiers from the manager.
"""

from __future__ import annotations

import gc
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from oscarkv.config import EngineConfig, KVConfig
from oscarkv.engine.assembly import build_runner_and_codec, eos_ids
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.model_runner import PendingIds, RunnerOutput
from oscarkv.engine.runner import Runner, one_token_step
from oscarkv.engine.scheduler import ScheduledChunk
from oscarkv.models.llama import PagedLM
from oscarkv.models.shapes import shape_config
from oscarkv.quant.artifact import Artifact, ModelFingerprint, new_manifest
from oscarkv.quant.codec import default_group
from oscarkv.quant.rotation import compose

log = logging.getLogger(__name__)


def write_json(out: Path | None, cfg, rows: list, **extra) -> None:
    """A bench's JSON (nothing when ``out`` is None): the device, the bench's config, ``extra`` fields, the rows."""
    if out is None:
        return
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": device, "config": asdict(cfg), **extra, "rows": rows}, indent=1))


def release() -> None:
    """Free a dropped engine's pools now (runner and graphs reference each other: a cycle)."""
    gc.collect()
    torch.cuda.empty_cache()


def event_seconds(fn, reps: int = 20) -> float:
    """Seconds per call of ``fn`` on the current CUDA stream (CUDA events, after one warm-up call)."""
    fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps / 1e3


def random_model(shape: str, tensor_parallel_size: int = 1) -> PagedLM:
    """Random bf16 weights at a real shape, on the GPU; with tensor parallelism on the host, drawn on the
    GPU one tensor at a time (the ranks copy their shards up: Qwen3-32B does not fit one H100 beside rank 0's
    shard)."""
    config = shape_config(shape)
    if tensor_parallel_size == 1:
        return PagedLM.random(config, torch.bfloat16, "cuda")
    with torch.device("meta"):
        model = PagedLM(config)
    model = model.to(torch.bfloat16).to_empty(device="cpu")
    with torch.device("cpu"):  # NOTE: to_empty leaves buffers unset: the rotary table is built anew
        model.model.rotary_emb = type(model.model.rotary_emb)(config).to(torch.bfloat16)
    gen, std = torch.Generator("cuda").manual_seed(0), getattr(config, "initializer_range", 0.02)
    with torch.no_grad():
        for name, p in model.named_parameters():  # as PagedLM.random: unit norms, zero biases, normal weights
            if "norm" in name or name.endswith("bias"):
                p.fill_(1.0 if "norm" in name else 0.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, device="cuda", dtype=torch.bfloat16).mul_(std))
    return model.eval().requires_grad_(False)


def one_kind(all_reduce: str, tensor_parallel_size: int, engines: int) -> str:
    """The all-reduce of a bench run's ``engines`` engines in one process: ``auto`` with several tensor-parallel
    ones is ``nccl`` for all (a symmetric-memory engine is one per process: only the first could take it, and its
    rows would be compared with NCCL's). One engine, or an explicit kind, as given."""
    if all_reduce != "auto" or tensor_parallel_size == 1 or engines <= 1:
        return all_reduce
    log.warning("all-reduce auto: nccl for all %d engines of this run (one symmetric-memory engine per process); "
                "time one --methods value per run for the symmetric-memory kinds", engines)
    return "nccl"


def build_engine(model: PagedLM, method: str | KVConfig, kv_bytes: int, max_num_seqs: int, chunk: int = 8192,
                 tensor_parallel_size: int = 1, all_reduce: str = "auto", engines: int = 1, **engine) -> LLMEngine:
    """Engine over ``model`` (``bf16``, ``naive`` INT2, or ``oscar`` with :func:`random_artifact`; or a whole
    ``KVConfig``, e.g. a per-layer allocation) and a :class:`BenchRunner`, no prefix caching, default windows
    (64 + 256, P = 64) for a method name; ``kv_bytes`` per GPU with
    tensor parallelism, whose ranks run on the GPUs whatever holds ``model`` (:func:`random_model` leaves it
    on the host; on a CPU-only machine the ranks run on the CPU) and sum through ``all_reduce``
    (``EngineConfig.tensor_parallel_all_reduce``; :func:`one_kind` of the run's ``engines``); ``engine``: other
    ``EngineConfig`` fields (e.g. ``l2_prefetch``)."""
    kv = method if isinstance(method, KVConfig) else KVConfig(method)
    cfg = EngineConfig(kv, kv_memory_bytes=kv_bytes, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=chunk * max_num_seqs + max_num_seqs, prefill_chunk=chunk,  # all advance
                       enable_prefix_caching=False, tensor_parallel_size=tensor_parallel_size,
                       tensor_parallel_all_reduce=one_kind(all_reduce, tensor_parallel_size, engines), **engine)
    return bench_engine(model, cfg, random_artifact(model.config) if kv.method == "oscar" else None)


def bench_engine(model: PagedLM, cfg: EngineConfig, artifact: Artifact | None = None, tokenizer=None) -> LLMEngine:
    """An engine for ``cfg`` whose runner is a :class:`BenchRunner` (tensor-parallel ranks on the GPUs if
    there are any, else on the CPU); ``tokenizer``: for text prompts (any whose ids fit the model's vocabulary)."""
    tp = cfg.tensor_parallel_size > 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu") if tp else None
    runner, codec = build_runner_and_codec(model, cfg, artifact, device=device)
    return LLMEngine(BenchRunner(runner), codec, cfg, tokenizer, eos_ids(model.config, None))


def random_artifact(config, seed: int = 0) -> Artifact:
    """An OSCAR artifact for a random-weight model, with everything the recipe's artifacts hold — orthogonal
    ``U·H·P_br`` rotations, key means (values uncentered), importance scales, per-layer clips — drawn at random:
    decode speed depends on what the codec computes, not on the values."""
    fp = ModelFingerprint.from_config(config)
    L, H, d = fp.num_layers, fp.num_kv_heads, fp.head_dim
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for kind in ("key", "value"):
        u = torch.linalg.qr(torch.randn(L, H, d, d, generator=g, dtype=torch.float64))[0]
        scale = torch.empty(L, H, d, dtype=torch.float64).uniform_(0.5, 2.0, generator=g)
        tensors |= {f"{kind}.eigvecs": u.float(), f"{kind}.rotation": compose(u, "uhp").float(),
                    f"{kind}.eigenvalues": torch.rand(L, H, d, generator=g).sort(-1, descending=True).values,
                    f"{kind}.mean": (torch.randn(L, H, d, generator=g) if kind == "key" else torch.zeros(L, H, d)),
                    f"{kind}.scale": (scale / scale.square().mean(-1, keepdim=True).sqrt()).float()}
    group = default_group(d, None)
    manifest = new_manifest(fp, {"random": True}, group, {"key": [0.92] * L, "value": [0.92] * L},
                            {"source": "random (benchmark)"})
    art = Artifact(manifest, tensors)
    art.validate(fp)
    return art


def weight_bytes(model: PagedLM) -> int:
    """Bytes of weights one decode step reads: every parameter once, except an untied embedding table
    (only one row per token is read)."""
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if tied or "embed_tokens" not in n)


def kv_read_bytes(engine: LLMEngine, seqs) -> int:
    """KV bytes one decode step reads for ``seqs`` (every stored token once, K and V, all layers; history at each
    layer's own bits: ``PoolGeometry.int2_page_bytes``)."""
    geo = engine.runner.pools.geo
    window = 2 * geo.num_layers * geo.num_kv_heads * geo.head_dim * geo.window_dtype.itemsize  # per BF16 token
    n = 0
    for s in seqs:
        sink, hist, recent = engine.manager.tier_tokens(s)
        n += (sink + recent) * window + hist * geo.int2_page_bytes() // geo.page_size
    return n


def add_prompts(engine: LLMEngine, n: int, length: int, new_tokens: int, seed: int = 0,
                temperature: float = 0.0) -> None:
    """``n`` random prompts of ``length`` tokens, each generating ``new_tokens`` (greedy, or drawn at
    ``temperature`` with a per-request seed), with the fill's chunk ends (see the module docstring)."""
    from oscarkv.engine.request import SamplingParams

    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=new_tokens, temperature=temperature, ignore_eos=True)
    vocab, c = engine.vocab_size, engine.cfg.prefill_chunk
    ends = (*range(c, length - 1, c), length - 1)  # explicit ends replace the default ones
    for i in range(n):
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        engine.add_request(f"r{seed}-{i}", ids, params, chunk_ends=ends)


def fill(runner: Runner, chunks: list[ScheduledChunk]) -> None:
    """Random stored-domain K/V into the chunks' slots and their demotions, through the write path (rank 0's
    pools only with tensor parallelism: the other ranks' pages stay zero, which a decode step reads alike)."""
    r = runner
    plans = [c.plan for c in chunks]
    slots = torch.tensor([s for p in plans for s in p.slots], dtype=torch.int32, device=r.device)
    src = torch.tensor([s for p in plans for s in p.demote_src], dtype=torch.int32, device=r.device)
    dst = torch.tensor([s for p in plans for s in p.demote_dst], dtype=torch.int32, device=r.device)
    geo = r.pools.geo
    k, v = torch.randn(2, slots.numel(), geo.num_kv_heads, geo.head_dim, device=r.device)
    for i in range(geo.num_layers):
        r.backend.write(r.pools.layer(i), k, v, slots)
    if src.numel():
        r.backend.demote_all(r.pools, r.storage, src, dst)


@dataclass(frozen=True)
class Launch:
    """One ``run`` of a :class:`BenchRunner`."""

    decode: bool  # every chunk one token (the step's shape: ``engine.runner.one_token_step``)
    batch: int  # chunks run through the model
    filled: int = 0  # chunks filled instead (:func:`fill`)
    tokens: int = 0  # tokens run through the model (a verify step: its 1 + k rows)


class BenchRunner:
    """A :class:`~oscarkv.engine.runner.Runner` around ``inner`` (see the module docstring): every ``run`` is
    recorded in ``launches``; while ``filling``, chunks that sample nothing are filled (:func:`fill`) and only
    the others run the model. The attributes are ``inner``'s (rank 0's with tensor parallelism)."""

    def __init__(self, inner: Runner) -> None:
        self.inner = inner
        self.model, self.pools, self.device, self.tp = inner.model, inner.pools, inner.device, inner.tp
        self.backend, self.storage, self.graphs = inner.backend, inner.storage, inner.graphs
        self.extend_graphs = inner.extend_graphs
        self.demote_all = getattr(inner, "local", inner).demote_all  # rank 0's ModelRunner's (one rank's pages)
        self.launches: list[Launch] = []
        self.filling = False

    def run(self, chunks: list[ScheduledChunk], pending: PendingIds | None = None) -> RunnerOutput:
        decode = one_token_step(chunks)
        filled = [c for c in chunks if not c.samples] if self.filling else []
        if filled:
            fill(self, filled)
            chunks = [c for c in chunks if c.samples]
        self.launches.append(Launch(decode, len(chunks), len(filled), sum(c.plan.t1 - c.plan.t0 for c in chunks)))
        if not chunks:
            return RunnerOutput(torch.zeros(0, self.model.config.vocab_size, device=self.device), {})
        return self.inner.run(chunks, pending)

    def failure(self) -> str | None:
        return self.inner.failure()

    def close(self) -> None:
        self.inner.close()

    def replay(self, bucket: int) -> None:
        self.inner.replay(bucket)

    def capture_graphs(self, rows: int) -> int:  # NOTE: a single-device inner runner's (ModelRunner)
        return self.inner.capture_graphs(rows)

    def num_graphs(self) -> int:
        return self.inner.num_graphs()

    def profile(self, bucket: int, reps: int = 5) -> list[dict]:
        return self.inner.profile(bucket, reps)

    def host_profile(self, on: bool, runtime: bool = False) -> None:  # NOTE: a tensor-parallel inner runner's
        self.inner.host_profile(on, runtime)


@dataclass
class DriveStats:
    model_s: float = 0.0  # engine steps that ran the model only (decode): host and device, wall time
    fill_s: float = 0.0  # engine steps that filled prompt chunks, synchronized
    steps: int = 0  # model launches (steps launched ahead included)
    batch_sizes: list[int] = field(default_factory=list)
    model_calls_s: list[float] = field(default_factory=list)  # each model step's ``step()`` call


def drive(engine: LLMEngine, max_steps: int | None = None) -> DriveStats:
    """Run the engine's requests through ``LLMEngine.step`` with its :class:`BenchRunner` filling (see the
    module docstring); a step that fills prompt chunks is timed, whole and synchronized, into ``fill_s``, every
    other one into ``model_s``. NOTE: with overlap a step may return before the device is done; the next step
    waits for it, and the loop ends synchronized, so ``model_s`` is the wall time of the model steps."""
    runner, st = engine.runner, DriveStats()
    if not isinstance(runner, BenchRunner):
        raise TypeError("drive: build the engine with build_engine or bench_engine (a BenchRunner fills prompts)")
    outputs = []  # NOTE: kept, as a caller keeps them (LLM.generate returns them, a server hands them to
    # another thread): freeing a 100K-token prompt's Python ints takes ~1.5 ms, the caller's time, not a step's
    runner.filling = True
    try:
        sync()
        while engine.has_unfinished() and (max_steps is None or st.steps < max_steps):
            n, t = len(runner.launches), time.perf_counter()
            outputs += engine.step()
            new = runner.launches[n:]
            for launch in new:
                if launch.batch:
                    st.steps += 1
                    st.batch_sizes.append(launch.batch)
            if any(launch.filled for launch in new):
                sync()
                st.fill_s += time.perf_counter() - t
            else:
                st.model_calls_s.append(time.perf_counter() - t)
                st.model_s += st.model_calls_s[-1]
        t = time.perf_counter()
        sync()
        st.model_s += time.perf_counter() - t
    finally:
        runner.filling = False
    return st


def host_functions(fn, calls: int = 1, top: int = 14) -> list[dict]:
    """cProfile of ``calls`` calls of ``fn`` (synchronized at the end): the functions with the most own time, µs per
    call (``rank_profile.host_rows``). No CUPTI: later timings keep."""
    import cProfile

    from oscarkv.engine.rank_profile import host_rows

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    sync()
    prof.disable()
    return [dict(r, us=r["us"] / calls) for r in host_rows(prof, top)]


def runtime_functions(fn, top: int = 16) -> list[dict]:
    """The host operators of one call of ``fn`` (synchronized at the end) with the most own time
    (``rank_profile.runtime_rows``: aten ops, CUDA runtime calls, collectives)."""
    from oscarkv.engine.rank_profile import runtime_profiler, runtime_rows

    prof = runtime_profiler()
    fn()
    sync()
    return runtime_rows(prof, top)


def sync() -> None:
    """Wait for the GPU, if there is one."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
