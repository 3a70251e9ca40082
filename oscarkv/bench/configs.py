"""What each ``oscarkv bench`` subcommand measures: one frozen dataclass per benchmark.

Kept apart from the benchmarks themselves (which import torch and Triton) so that the command
line builds its flags and ``--help`` from these fields without importing either. Each checks its
counts and methods on construction, so that a bad flag is one line before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oscarkv.bench.layer_bits import is_fraction
from oscarkv.config import ENGINE_METHODS, PIECEWISE_BUCKETS, SPECULATIVE_METHODS, prefetch_points


def _check_positive(bench, *names: str) -> None:
    """Each named field (an int or a tuple of ints) must be >= 1."""
    for name in names:
        value = getattr(bench, name)
        if min(value if isinstance(value, tuple) else (value,), default=0) < 1:
            raise ValueError(f"{type(bench).__name__}.{name} must be >= 1, got {value}")


def _check_methods(bench, name: str = "methods", known: tuple[str, ...] = ENGINE_METHODS) -> None:
    """The named field must be a non-empty tuple of methods of ``known``."""
    value = getattr(bench, name)
    if not value or any(m not in known for m in value):
        raise ValueError(f"{type(bench).__name__}.{name} must be methods of {known}, got {value}")


@dataclass(frozen=True)
class AttentionBench:
    """What ``oscarkv bench attention`` measures: decode attention kernels, BF16 vs INT2 vs PyTorch."""

    contexts: tuple[int, ...] = (8192, 32768, 65536, 131072)
    """Tokens per sequence."""
    batches: tuple[int, ...] = (1, 8, 32, 64)
    """Sequences per decode step."""
    q_heads: int = 32
    """Query heads (Qwen3-8B)."""
    kv_heads: int = 8
    """KV heads (Qwen3-8B)."""
    head_dim: int = 128
    """Channels per head."""
    page_size: int = 64
    """Tokens per page."""
    sink: int = 64
    """BF16 sink tokens."""
    recent: int = 256
    """BF16 recent window tokens."""
    memory_gib: float = 60.0
    """Skip a configuration whose caches would exceed this many GiB."""
    key_bits: int = 2
    """Bits of the low-bit cache's history keys, 2 or 4 (the precision ladder; 4: two INT2 planes)."""
    value_bits: int = 2
    """Bits of the low-bit cache's history values, 2 or 4."""
    levels: bool = False
    """Also time the low-bit cache with a non-uniform 2-bit level table on its 2-bit kinds (column ``int2-lm``:
    the Lloyd-Max path of the kernels, ``oscarkv.quant.int2``) beside the uniform one."""

    def __post_init__(self) -> None:
        _check_positive(self, "contexts", "batches", "q_heads", "kv_heads", "head_dim", "page_size")
        for name in ("key_bits", "value_bits"):
            if getattr(self, name) not in (2, 4):
                raise ValueError(f"AttentionBench.{name} must be 2 or 4, got {getattr(self, name)}")


@dataclass(frozen=True)
class DecodeBench:
    """What ``oscarkv bench decode`` measures: end-to-end decode steps, random weights at real shapes."""

    shapes: tuple[str, ...] = ("qwen3-4b", "qwen3-8b")
    """Model shapes (oscarkv.models.shapes)."""
    contexts: tuple[int, ...] = (30720, 61440, 102400)
    """Prompt tokens."""
    methods: tuple[str, ...] = ("bf16", "naive")
    """KV methods (bf16, naive, oscar: a random artifact)."""
    warmup: int = 4
    """Untimed decode steps first."""
    steps: int = 24
    """Timed decode steps."""
    kv_gib: float = 16.0
    """KV pool budget in GiB."""
    batch: int = 1
    """Sequences decoding together, each at the row's context (the job-throughput runs of ``bench capacity``
    decode 26 × 100K at once: ``--batch 26 --kv-gib 56`` times one such step)."""
    temperature: float = 0.0
    """Sampling temperature of the timed requests (0: greedy); drawn tokens are chosen on the GPU too."""
    tensor_parallel_size: int = 1
    """GPUs the model is split over (``EngineConfig.tensor_parallel_size``): floors are rank 0's, and the
    graph column replays every rank's graph together (``oscarkv.bench.decode``)."""
    all_reduce: str = "auto"
    """The row-parallel all-reduce with ``tensor_parallel_size > 1`` (``EngineConfig.tensor_parallel_all_reduce``:
    auto, nccl, one_shot, two_shot, one_shot_norm)."""
    profile: bool = False
    """Also profile the graph of each row at the longest context (torch.profiler; with tensor parallelism,
    whole engine steps). NOTE: CUPTI stays attached after a profile and slows later graph launches (seen
    on an H100, 2026-11-22: 21 µs → 320 µs): time in one invocation, profile in another."""
    l2_prefetch: tuple[str, ...] = ("off",)
    """Weight prefetch variants (``EngineConfig.l2_prefetch``, points joined by ``+``: e.g. ``off,attn,all``): every
    method and allocation is timed under each, labelled ``METHOD l2=VARIANT`` unless ``off``."""
    l2_prefetch_mib: int = 24
    """Bytes prefetched at each point, at most (``EngineConfig.l2_prefetch_mib``)."""
    layer_key_bits: tuple[str, ...] = ()
    """Per-layer allocations timed after ``methods``, each as an ``oscar`` row (``KVConfig.layer_key_bits``,
    :mod:`oscarkv.bench.layer_bits`): a recipe JSON (its windows, its share of 4-bit-key layers spread over the
    shape's layers as the recipe spreads them) or a fraction in (0, 1] of 4-bit-key layers, evenly spaced."""

    def __post_init__(self) -> None:
        _check_methods(self)
        _check_positive(self, "contexts", "steps", "batch", "tensor_parallel_size", "l2_prefetch_mib")
        _check_allocations(self)
        for v in self.l2_prefetch:
            prefetch_points(v)


@dataclass(frozen=True)
class CapacityBench:
    """What ``oscarkv bench capacity`` measures: tokens in a KV budget and job throughput."""

    shape: str = "qwen3-4b"
    """Model shape (:data:`oscarkv.models.shapes.SHAPES`)."""
    kv_gib: float = 56.0
    """KV pool budget, the same for every method."""
    context: int = 102400
    """Prompt tokens per request."""
    requests: int = 32
    """Requests in the throughput run."""
    new_tokens: int = 16
    """Greedy tokens decoded per request."""
    methods: tuple[str, ...] = ("bf16", "naive")
    """KV methods to run, in order; each needs a chunk in :attr:`chunks`, and ``bf16`` must be one."""
    tensor_parallel_size: int = 1
    """GPUs the model is split over (``EngineConfig.tensor_parallel_size``): each holds ``kv_gib`` for its
    ``max(1, H_kv / n)`` KV heads; bytes per token are the group's."""
    chunks: tuple[tuple[str, int], ...] = (("bf16", 2048), ("naive", 256), ("oscar", 256))
    """Prefill chunk per method for the throughput run; the token budget is ``chunk × seqs + seqs``
    so that every running sequence advances each step (a wave prefills, then decodes, together)."""

    def __post_init__(self) -> None:
        known = tuple(m for m, _ in self.chunks)
        unknown = [m for m in self.methods if m not in known]
        if unknown:
            raise ValueError(f"CapacityBench.methods: unknown method(s) {unknown}; choose from {known}")
        if "bf16" not in self.methods:
            raise ValueError(f"CapacityBench.methods must include 'bf16' (the × BF16 columns), got {self.methods}")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"CapacityBench.methods has a repeated method: {self.methods}")
        _check_positive(self, "context", "requests", "new_tokens", "tensor_parallel_size")


@dataclass(frozen=True)
class PrefillBench:
    """What ``oscarkv bench prefill`` measures: time to first token of one long prompt through the engine."""

    shapes: tuple[str, ...] = ("qwen3-4b", "qwen3-8b")
    """Model shapes (oscarkv.models.shapes)."""
    contexts: tuple[int, ...] = (8192, 32768, 102400)
    """Prompt tokens."""
    methods: tuple[str, ...] = ("bf16", "oscar")
    """KV methods (bf16, naive, oscar: a random artifact)."""
    chunks: tuple[int, ...] = (2048, 8192)
    """Prefill chunk sizes (tokens per engine step)."""
    kv_gib: float = 16.0
    """KV pool budget in GiB."""
    profile_context: int = 32768
    """Context of the profiled runs that split the time by part (one per shape, method and chunk; 0: none;
    rank 0's kernels only with tensor parallelism)."""
    tensor_parallel_size: int = 1
    """GPUs the model is split over (``EngineConfig.tensor_parallel_size``; the row-parallel all-reduce is
    ``auto``: prefill chunks go through NCCL whatever it is): the floor is rank 0's (its heads, its GEMMs)."""
    layer_key_bits: tuple[str, ...] = ()
    """Allocations timed after ``methods``, as ``DecodeBench.layer_key_bits`` (a recipe JSON, per layer or per head,
    or a fraction of 4-bit-key layers)."""

    def __post_init__(self) -> None:
        _check_methods(self)
        _check_positive(self, "contexts", "chunks", "tensor_parallel_size")
        _check_allocations(self)


@dataclass(frozen=True)
class JobsBench:
    """What ``oscarkv bench jobs`` measures: whole jobs (real prefill through the model, then decode) in one KV budget."""

    shape: str = "qwen3-4b"
    """Model shape (:data:`oscarkv.models.shapes.SHAPES`)."""
    kv_gib: float = 56.0
    """KV pool budget, the same for every method."""
    context: int = 102400
    """Prompt tokens per request."""
    requests: int = 32
    """Requests in the job."""
    new_tokens: tuple[int, ...] = (256, 2048, 8192)
    """Tokens decoded per request: the first is run end to end; the others are computed from that run's
    measured prefill time and decode step times (see ``oscarkv.bench.jobs``)."""
    methods: tuple[str, ...] = ("bf16", "oscar")
    """KV methods, in order; without ``bf16`` the × BF16 column is left empty (a long BF16 job may be run in
    separate commands, ``--requests`` apiece, and its times summed)."""
    tensor_parallel_size: int = 1
    """GPUs the model is split over (``EngineConfig.tensor_parallel_size``): each holds ``kv_gib`` for its
    ``max(1, H_kv / n)`` KV heads (the whole random model stays on the host, ``oscarkv.bench.e2e``)."""
    chunks: tuple[tuple[str, int], ...] = (("bf16", 8192), ("naive", 2048), ("oscar", 2048))
    """Prefill chunk per method; the step budget is ``chunk × seqs + seqs`` (every running sequence advances each
    step). OSCAR's 26 sequences × 2048 tokens keep a step's activations within what the 56 GiB of pools leave."""
    chunk: int | None = None
    """One prefill chunk for every method (auto: each its entry of :attr:`chunks`, sized for many sequences at once;
    with few, 2048-token chunks only add steps: 4 × 100K on 4 GPUs took 11.5 s against 10.1 in 8192)."""

    def __post_init__(self) -> None:
        known = tuple(m for m, _ in self.chunks)
        if not self.methods or [m for m in self.methods if m not in known]:
            raise ValueError(f"JobsBench.methods must be methods of {known}, got {self.methods}")
        _check_positive(self, "context", "requests", "new_tokens", "tensor_parallel_size")
        if self.chunk is not None:
            _check_positive(self, "chunk")

    def chunk_of(self, method: str) -> int:
        """The prefill chunk ``method`` runs in: :attr:`chunk`, else its entry of :attr:`chunks`."""
        return self.chunk or dict(self.chunks)[method]


@dataclass(frozen=True)
class EngineBench:
    """What ``oscarkv bench engine`` measures (on the CPU)."""

    methods: tuple[str, ...] = ("bf16", "oscar")
    """KV methods (oscar: the default model's cached calibration, or --rotations)."""
    batches: tuple[int, ...] = (1, 8, 32)
    """Batch sizes."""
    prompt_len: int = 512
    """Prompt tokens per sequence."""
    new_tokens: int = 32
    """Decode tokens per sequence."""
    tensor_parallel_size: int = 1
    """Processes the model is split over (``EngineConfig.tensor_parallel_size``, gloo on the CPU); KV
    bytes are the whole group's."""

    def __post_init__(self) -> None:
        _check_methods(self)
        _check_positive(self, "batches", "prompt_len", "new_tokens", "tensor_parallel_size")


@dataclass(frozen=True)
class ServeBench:
    """What ``oscarkv bench serve`` measures: a loopback server per KV method, driven by the openai client."""

    kv: tuple[str, ...] = ("bf16", "oscar")
    """KV methods, one server each."""
    concurrency: tuple[int, ...] = (1, 8, 32)
    """Requests in flight per level."""
    requests: int = 0
    """Requests per level; ``0``: ``max(4, 2 * concurrency)``."""
    max_tokens: int = 16
    """Generated tokens per request (``ignore_eos``, so every request generates exactly this many)."""

    def __post_init__(self) -> None:
        _check_methods(self, "kv")
        _check_positive(self, "concurrency", "max_tokens")


@dataclass(frozen=True)
class FollowupBench:
    """What ``oscarkv bench followup`` measures: the first engine step of a request whose long prefix is cached
    (a follow-up turn on a cached document), beside a decode step at the same context."""

    shapes: tuple[str, ...] = ("qwen3-4b",)
    """Model shapes (oscarkv.models.shapes; random weights)."""
    contexts: tuple[int, ...] = (32768, 102400)
    """Cached prefix tokens (multiples of the page size)."""
    new_tokens: tuple[int, ...] = (1, 8, 64, 512)
    """New tokens of the follow-up request (k), computed in its first step over the cached prefix."""
    methods: tuple[str, ...] = ("bf16", "oscar")
    """KV methods (bf16, naive, oscar: a random artifact)."""
    repeats: int = 3
    """Follow-up requests per k (each with fresh new tokens); the last is reported, all are in the JSON. Three: a
    follow-up shape met again captures its staged graph (``ExtendGraphs.staged``), the third question replays it."""
    steps: int = 16
    """Timed decode steps at the same context."""
    kv_gib: float = 24.0
    """KV pool budget in GiB."""
    prefill_chunk: int = 0
    """0: the prefill chunk is the largest k (rounded up to a page), so the cached prefix is hit whole (a
    diagnostic); N (e.g. 512, ``EngineConfig.prefill_chunk``'s default): chunks as a server makes them, the cached
    prompt ``context + N // 2`` tokens long (half a chunk past a multiple: the mean misalignment), so a follow-up
    also recomputes the cached prompt's last partial chunk — what a user of ``serve`` waits for."""
    resume_turns: bool = True
    """The follow-up resumes where the cached prompt ended (``add_request(resume=...)``, what a chat follow-up gets from
    ``EngineConfig.resume_turns``), so the cached prompt's last partial chunk is a hit; off: it is recomputed."""
    piecewise_graph_buckets: tuple[int, ...] = PIECEWISE_BUCKETS
    """``EngineConfig.piecewise_graph_buckets`` of the engines (a follow-up of up to 512 tokens replays every
    layer's work but attention as graphs, ``oscarkv.engine.piecewise``; the engine's default on one GPU); empty
    (``--piecewise-graph-buckets ''``): eager."""
    profile: bool = False
    """Also profile the host of one more follow-up per k at the longest context (cProfile: the functions with the
    most own time, in the row's ``host``; no CUPTI, so the timings beside it keep)."""

    def __post_init__(self) -> None:
        _check_methods(self)
        _check_positive(self, "contexts", "new_tokens", "repeats", "steps")
        if self.prefill_chunk < 0:
            raise ValueError(f"--prefill-chunk must be >= 0 (0: one chunk of k tokens), got {self.prefill_chunk}")


@dataclass(frozen=True)
class SpeculativeBench:
    """What ``oscarkv bench speculative`` measures: batch-1 speculative decoding, with and without drafts —
    acceptance and speed on a real model (a copy-heavy task and one that does not copy), and on a GPU the cost
    of a verify step of K drafts against a decode step at real shapes (random weights)."""

    methods: tuple[str, ...] = ("bf16", "oscar")
    """KV methods (oscar: the model's artifact on the real model, a random one at the shapes)."""
    speculative: str = "ngram"
    """The drafting method compared with none (``SpeculativeConfig.method``)."""
    num_speculative_tokens: tuple[int, ...] = (2, 4)
    """Drafts per verify step (K), each compared with K = 0 (no speculation)."""
    min_accepted_tokens: float = 0.45
    """The draft gate's floor on the real model (``SpeculativeConfig.min_accepted_tokens``; at most the smallest K)."""
    measured_floor: bool = False
    """The floor from each engine's own step times instead (``SpeculativeConfig.measured_floor``)."""
    document_tokens: int = 1024
    """Tokens of the document both real-model tasks start with (cut at a line end; at most the model's context)."""
    max_tokens: int = 64
    """Greedy tokens generated per task."""
    repeats: int = 1
    """Times each task is served on one engine (greedy: the same tokens): the median ms per token is reported,
    every run's beside it (the spread a 5% difference must exceed)."""
    shapes: tuple[str, ...] = ()
    """Model shapes for the verify-step cost (CUDA only; e.g. qwen3-4b); empty: the real model only."""
    contexts: tuple[int, ...] = (32768, 102400)
    """Contexts of the verify-step cost at the shapes."""
    steps: int = 16
    """Timed engine steps per verify-cost row."""
    kv_gib: float = 24.0
    """KV pool budget in GiB at the shapes."""

    def __post_init__(self) -> None:
        _check_methods(self)
        if self.speculative not in SPECULATIVE_METHODS or self.speculative == "none":
            raise ValueError(f"SpeculativeBench.speculative must be one of {SPECULATIVE_METHODS[1:]}, got {self.speculative!r}")
        _check_positive(self, "num_speculative_tokens", "document_tokens", "max_tokens", "repeats", "contexts", "steps")
        if not 0 <= self.min_accepted_tokens <= min(self.num_speculative_tokens):
            raise ValueError(f"SpeculativeBench.min_accepted_tokens must be in [0, the smallest "
                             f"SpeculativeBench.num_speculative_tokens ({min(self.num_speculative_tokens)})], "
                             f"got {self.min_accepted_tokens}")


def _check_allocations(bench) -> None:
    for spec in bench.layer_key_bits:
        if not is_fraction(spec) and not Path(spec).is_file():
            raise ValueError(f"{type(bench).__name__}.layer_key_bits: {spec!r} is neither a fraction in (0, 1] nor a "
                             f"recipe file")
