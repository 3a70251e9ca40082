"""Typed configuration: one frozen dataclass per concern, validated on construction.

CLI flags derive from these fields (``oscarkv.cli.flags``); nothing is read from environment
variables here (the one exception, a secret, is read by ``oscarkv serve``: ``OSCARKV_API_KEY``). ``KVConfig`` says how the KV cache is stored; ``CalibrationConfig`` how the
rotation artifact is fitted; ``EvalConfig`` what is measured; ``EngineConfig`` how the paged
engine runs; ``ServerConfig`` what the HTTP layer adds. This module imports nothing heavy
(the command line's ``--help`` reads it without torch).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

__version__ = "0.1.0"
"""The package version (recorded in every artifact manifest)."""

CACHE_DIR = Path.home() / ".cache" / "oscarkv"
"""Default home of derived files: converted GGUF models and the default model's artifact."""

DTYPES = ("auto", "bfloat16", "float32")
"""Model compute dtypes by name; ``auto``: bfloat16 where a GPU runs the model, float32 where a CPU does
(``oscarkv.models.loader.resolve_dtype``)."""

DEVICES = ("auto", "cpu", "cuda")
"""Where a loaded model runs; ``auto``: the first CUDA device when one is visible, else the CPU
(``oscarkv.models.loader.resolve_device``). The engine runs where the model's weights are."""

TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt")
"""Synthetic long-context tasks (``oscarkv.eval.tasks``)."""

CENTER_MODES = ("both", "keys", "values", "none")
"""Which kinds ``CalibrationConfig.center`` centers."""

CLIP_MODES = ("fitted", "fixed", "none")
"""How ``CalibrationConfig.clip`` sets a kind's clip ratio."""

QUERY_WEIGHTINGS = ("uniform", "retrieval")
"""How ``CalibrationConfig.query_weighting`` weighs the calibration queries in ``C_Q``."""

HAYSTACKS = ("eval", "gazetteer", "calibration")
"""Filler texts of the synthetic tasks (``oscarkv.eval.tasks.HAYSTACKS`` maps them to files)."""

METHODS = ("bf16", "int4", "naive", "quarot", "kivi", "oscar")
"""KV storage methods, all served by one codec path (``oscarkv.quant.codec``)."""

LADDER_METHODS = ("naive", "quarot", "oscar")
"""Per-token methods whose key and value bits ``KVConfig.key_bits``/``value_bits`` choose."""

FIXED_BITS = ("bf16", "int4", "kivi")
"""Methods with their own bits (none, 4/4 without rotation, KIVI's 2/2)."""

DEV_PROTOCOLS = ("served", "forced")
"""How the recipe search scores a candidate (``RecipeSearchConfig.protocol``)."""

RUNGS = {"int2": (2, 2), "k4v2": (4, 2), "k2v4": (2, 4), "int4": (4, 4)}
"""The precision ladder: rung name → ``(key_bits, value_bits)`` of ``KVConfig``."""


@dataclass(frozen=True)
class KVConfig:
    """How KV entries are stored once they leave the current prefill chunk."""

    method: str = "oscar"
    """One of ``METHODS``: ``bf16`` (no quantization), ``int4`` (per-token 4-bit, no rotation),
    ``naive`` (INT2, no rotation), ``quarot`` (INT2 after a Hadamard), ``kivi`` (INT2 with
    per-channel keys over token blocks, per-token values), ``oscar`` (INT2 after the
    calibrated rotation, centering and fitted clipping; needs an artifact)."""
    sink: int = 64
    """Leading tokens kept in BF16 (the attention sink)."""
    recent: int = 256
    """Minimum number of most recent tokens kept in BF16 (W); the window holds W to W+P-1."""
    page_size: int = 64
    """Tokens per page (P): the unit of demotion from the recent window into low-bit history,
    and the token block over which KIVI quantizes keys per channel."""
    group_size: int | None = None
    """Channels per quantization group (G); ``None`` means ``min(head_dim, 128)``."""
    key_bits: int = 2
    """Bits per stored history key element, 2 or 4 (the precision ladder: INT2, K4V2, K2V4,
    INT4), for the per-token methods ``naive``, ``quarot`` and ``oscar``; 4-bit codes are two
    2-bit planes (``oscarkv.quant.int2``) and are not clipped (the artifact's clips were fitted
    for 2 bits). ``int4`` and ``kivi`` fix their own bits."""
    value_bits: int = 2
    """Bits per stored history value element, 2 or 4 (see ``key_bits``)."""
    key_clip: float | None = None
    """``oscar`` only: one clip ratio for every layer's INT2 keys in place of the artifact's fitted
    ones (``oscarkv.quant.clip``; 1: no clip), the recipe search's choice
    (``RecipeSearchConfig.key_clips``); ``None`` keeps the fitted ratios."""

    def __post_init__(self) -> None:
        if self.key_clip is not None and (self.method != "oscar" or not 0 < self.key_clip <= 1):
            raise ValueError(f"KVConfig.key_clip applies to method 'oscar' and lies in (0, 1], got {self.key_clip} "
                             f"for {self.method!r}")
        for name in ("key_bits", "value_bits"):
            if getattr(self, name) not in (2, 4):
                raise ValueError(f"KVConfig.{name} must be 2 or 4, got {getattr(self, name)}")
        if self.method in FIXED_BITS and self.bits != (2, 2):
            raise ValueError(f"KVConfig.key_bits/value_bits apply to {LADDER_METHODS}; method {self.method!r} "
                             f"fixes its own bits, got {self.bits[0]}/{self.bits[1]}")
        if self.method not in METHODS:
            raise ValueError(f"KVConfig.method must be one of {METHODS}, got {self.method!r}")
        for name in ("sink", "recent"):
            if getattr(self, name) < 0:
                raise ValueError(f"KVConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.page_size < 1:
            raise ValueError(f"KVConfig.page_size must be >= 1, got {self.page_size}")
        if self.method == "kivi" and self.page_size % 4:
            raise ValueError("KVConfig.page_size must be a multiple of 4 for kivi (keys pack along tokens)")
        if self.group_size is not None and self.group_size < 4:
            raise ValueError(f"KVConfig.group_size must be >= 4, got {self.group_size}")

    def without_windows(self) -> KVConfig:
        """The same method with no sink and no recent window.

        Per-token methods then demote every token at once (page size 1), so nothing outside
        the current chunk stays BF16; KIVI keeps its token blocks, so up to ``P - 1`` recent
        tokens remain full precision, as in KIVI itself."""
        page = self.page_size if self.method == "kivi" else 1
        return replace(self, sink=0, recent=0, page_size=page)

    @property
    def bits(self) -> tuple[int, int]:
        """``(key_bits, value_bits)``."""
        return self.key_bits, self.value_bits

    def stored_bits(self) -> tuple[int, int]:
        """Key and value bits of the history as stored: ``int4`` 4/4, the others ``bits`` (KIVI 2/2)."""
        return (4, 4) if self.method == "int4" else self.bits

    def rung(self) -> str:
        """The precision rung of a per-token method: ``int2``, ``k4v2``, ``k2v4`` or ``int4``."""
        kb, vb = self.bits
        return "int2" if kb == vb == 2 else "int4" if kb == vb == 4 else f"k{kb}v{vb}"

    def label(self) -> str:
        """Short name used in reports: ``oscar`` with windows is ``oscar+win``; a rung other than INT2
        is named after the method (``oscar-k4v2+win``)."""
        if self.method == "bf16":
            return "bf16"
        name = self.method if self.bits == (2, 2) or self.method in FIXED_BITS else f"{self.method}-{self.rung()}"
        return f"{name}+win" if (self.sink or self.recent) else name


@dataclass(frozen=True)
class RecipeSearchConfig:
    """How ``oscarkv calibrate`` chooses the BF16 windows on the development objective
    (``oscarkv.eval.objective``): development NIAH answer NLL on the calibration haystack."""

    max_bpe: float | None = None
    """Bits per KV element allowed at ``context`` (windows included); ``None``: no search."""
    context: int = 32768
    """The context length at which ``max_bpe`` is counted."""
    tolerance: float | None = None
    """Instead of the least NLL, the cheapest window whose development accuracy is at least
    ``1 - tolerance`` times BF16's."""
    dev_samples: int = 32
    """Development samples (split over ``dev_seeds``)."""
    dev_context: int = 2048
    """Prompt length of the development samples (tokens)."""
    dev_seeds: tuple[int, ...] = (1000, 1001)
    """Seeds of the development samples; evaluation uses others."""
    sinks: tuple[int, ...] = (0, 64, 128)
    """Candidate BF16 sink sizes (tokens); the engine serves whole pages only."""
    recents: tuple[int, ...] = (0, 64, 128, 256, 512, 1024, 2048)
    """Candidate BF16 recent window sizes (tokens)."""
    protocol: str = "served"
    """How a candidate is scored (``oscarkv.eval.objective``): ``served``, through the engine's
    chunked prefill as ``serve`` runs it (one prefill per sample and candidate), or ``forced``,
    one full-precision prefill per sample shared by every candidate (fast; blind to what chunked
    prefill loses)."""
    rungs: tuple[str, ...] = ("int2",)
    """Candidate key/value bits (``RUNGS``: ``int2``, ``k4v2``, ``k2v4``, ``int4``), each with every
    window; the chosen one is recorded in the recipe (``key_bits``, ``value_bits``)."""
    key_clips: tuple[float, ...] = ()
    """Candidate INT2 key clip ratios, each applied to every layer (``KVConfig.key_clip``; 1: no clip),
    beside the artifact's fitted ones, with every window and rung; a chosen one is recorded in the
    recipe (``key_clip``). The fit minimizes the held-out average error, which forgives clamping the
    large key components retrieval needs (docs/DEVELOPMENT.md)."""

    def __post_init__(self) -> None:
        if self.max_bpe is not None and self.max_bpe <= 2:
            raise ValueError(f"RecipeSearchConfig.max_bpe must exceed 2 bits, got {self.max_bpe}")
        if self.tolerance is not None and not 0 <= self.tolerance < 1:
            raise ValueError(f"RecipeSearchConfig.tolerance must lie in [0, 1), got {self.tolerance}")
        if any(not 0 < c <= 1 for c in self.key_clips):
            raise ValueError(f"RecipeSearchConfig.key_clips must lie in (0, 1], got {self.key_clips}")
        bad = [r for r in self.rungs if r not in RUNGS]
        if bad or not self.rungs:
            raise ValueError(f"RecipeSearchConfig.rungs: unknown {bad or 'empty list'}; choose from {tuple(RUNGS)}")
        if self.protocol not in DEV_PROTOCOLS:
            raise ValueError(f"RecipeSearchConfig.protocol must be one of {DEV_PROTOCOLS}, got {self.protocol!r}")
        if self.dev_samples < len(self.dev_seeds) or not self.dev_seeds:
            raise ValueError("RecipeSearchConfig.dev_samples must give every seed a sample")


@dataclass(frozen=True)
class CalibrationConfig:
    """How ``oscarkv calibrate`` fits rotations and clips (DESIGN.md §1)."""

    tokens: int = 16384
    """Calibration tokens streamed through the model for the second-moment statistics."""
    heldout_tokens: int = 1024
    """Further tokens, disjoint from the statistics, on which clip ratios are fitted."""
    chunk: int = 1024
    """Sequence length of each calibration forward pass."""
    rotation: str = "uhp"
    """Composition of R: ``uhp`` (U·H·P_br), ``u`` (eigenbasis only), ``h`` (Hadamard only)."""
    value_objective: str = "exact"
    """``exact``: C_S = second moment of attention outputs; ``proxy``: the reference's
    ``vᵀv`` weighted by ``k C_Q kᵀ``."""
    share_heads: bool = False
    """Average statistics over the KV heads of a layer (the reference's choice) instead of
    one rotation per (layer, KV head)."""
    center: str = "keys"
    """Subtract calibrated means before quantizing (an extension): ``both``, ``keys``,
    ``values`` or ``none``. Exact for keys (softmax is invariant to a per-query constant) and
    for values (the mean is added back after attention, whose weights sum to one). ``keys``
    was chosen on development samples and agrees with the held-out objective: centering
    values raises their output error (docs/RESULTS.md, "Development study")."""
    scaling: bool = True
    """Importance scaling (an extension beyond the paper): scale eigen-channel i by
    ``(λ_i / v_i)^(1/4)`` before the Hadamard (v: the stored data's variance along eigenvector
    i; λ: its C_Q eigenvalue for keys, 1 for values, whose output error weights every channel
    alike), which minimizes the weighted error of a uniform quantizer whose range follows the
    vector's norm. Matters most when one group spans the head (G = d), where an orthogonal R
    cannot shape the noise."""
    clip: str = "fitted"
    """``fitted`` per layer on held-out tokens, ``fixed`` (reference: 0.96 keys / 0.92 values) or
    ``none``; one mode for both kinds, or ``KEYS/VALUES`` (e.g. ``fixed/fitted``) per kind."""
    clip_grid: tuple[float, ...] = field(default=tuple(round(0.70 + 0.02 * i, 2) for i in range(16)))
    """Candidate clip ratios for fitting (1.0 = no clipping)."""
    group_size: int | None = None
    """Quantization group used when fitting clips; ``None`` means ``min(head_dim, 128)``."""
    seed: int = 0
    """Seed for the choice of calibration windows."""
    query_weighting: str = "uniform"
    """How the calibration queries weigh in the key objective's ``C_Q``: ``uniform`` (every query
    alike, the paper's average) or ``retrieval`` (each query row weighted by its retrieval score,
    the largest attention probability it puts on one key past the BF16 sink and at least the recent
    window's length back, normalized to mean 1: ``oscarkv.calibrate.stats.retrieval_scores``), which
    tilts the key rotation, scaling and clips toward the few sharp, long-range queries that retrieve."""
    stream_layers: bool = False
    """Run the statistics and held-out passes one decoder layer at a time, on the GPU when there is one
    (hidden states and weights stay in host memory, one layer's weights at a time on the GPU), so a model
    larger than the GPU calibrates; on the same device, the same artifact bit for bit."""

    def options(self) -> dict:
        """The fields an artifact's manifest records: all but ``stream_layers`` (how the passes ran,
        which changes nothing in the artifact), and ``query_weighting`` only when it is not ``uniform``
        (artifacts fitted before the option record none, and were fitted with uniform weights)."""
        skip = {"stream_layers"} | ({"query_weighting"} if self.query_weighting == "uniform" else set())
        return {k: v for k, v in asdict(self).items() if k not in skip}

    def clip_mode(self, kind: str) -> str:
        """The clip mode of ``kind`` (``key`` or ``value``)."""
        modes = self.clip.split("/")
        return modes[-1] if kind == "value" else modes[0]

    def centers(self, kind: str) -> bool:
        """Whether ``kind`` (``key`` or ``value``) is centered."""
        return self.center == "both" or self.center == kind + "s"

    def __post_init__(self) -> None:
        if self.rotation not in ("uhp", "u", "h"):
            raise ValueError(f"CalibrationConfig.rotation must be uhp, u or h, got {self.rotation!r}")
        if self.query_weighting not in QUERY_WEIGHTINGS:
            raise ValueError(f"CalibrationConfig.query_weighting must be one of {QUERY_WEIGHTINGS}, "
                             f"got {self.query_weighting!r}")
        if self.value_objective not in ("exact", "proxy"):
            raise ValueError(f"CalibrationConfig.value_objective must be exact or proxy, got {self.value_objective!r}")
        if isinstance(self.center, bool):  # artifacts of format 2 recorded a boolean
            object.__setattr__(self, "center", "both" if self.center else "none")
        if self.center not in CENTER_MODES:
            raise ValueError(f"CalibrationConfig.center must be one of {CENTER_MODES}, got {self.center!r}")
        modes = self.clip.split("/")
        if len(modes) > 2 or any(m not in CLIP_MODES for m in modes):
            raise ValueError(f"CalibrationConfig.clip must be one of {CLIP_MODES} or KEYS/VALUES of them "
                             f"(e.g. fixed/fitted), got {self.clip!r}")
        if self.tokens < self.chunk or self.chunk < 16:
            raise ValueError(f"CalibrationConfig needs tokens >= chunk >= 16, got tokens={self.tokens} chunk={self.chunk}")


@dataclass(frozen=True)
class EvalConfig:
    """What ``oscarkv eval`` measures."""

    methods: tuple[str, ...] = ("bf16", "naive", "quarot", "kivi", "oscar")
    """KV methods (``oscarkv.config.METHODS``)."""
    windows: tuple[bool, ...] = (True, False)
    """Evaluate each low-bit method with the BF16 sink/recent windows, without, or both."""
    tasks: tuple[str, ...] = TASKS + ("ppl",)
    """Synthetic tasks plus ``ppl`` (decode-faithful perplexity)."""
    contexts: tuple[int, ...] = (1024, 4096, 8192)
    """Prompt lengths in tokens."""
    samples: int = 20
    """Samples per (task, context); for ``ppl``, the number of text windows."""
    seed: int = 0
    """Seed of the task generators and text windows."""
    haystacks: tuple[str, ...] = ("eval", "gazetteer")
    """Filler texts of the synthetic tasks, each a separate cell: ``eval`` (Shakespeare, verse
    drama) and ``gazetteer`` (expository prose) for measurements, or ``calibration`` (the
    calibration source) for development studies that choose settings."""
    kv: KVConfig = field(default_factory=KVConfig)
    """Window and page geometry shared by all methods (its ``method`` is ignored)."""
    diagnostic: bool = True
    """With the engine backend, also score the teacher-forced single-chunk diagnostic on the
    same samples (every configuration, served or not)."""
    free: tuple[str, ...] = ()
    """With the engine backend, the methods run free-running (each costs a prefill per sample);
    empty: every served one. The others get the teacher-forced diagnostic only."""
    bf16_on_engine: bool = True
    """With the engine backend, generate BF16's free-running answers on the engine; off: by
    greedy generation from the diagnostic's full-precision prefill (the same computation, as
    the engine keeps an fp32 model's ``bf16`` K/V unrounded, at one prefill less per sample)."""
    batch: int = 4
    """With the engine backend, samples run at once through each engine as concurrent requests
    (continuous batching, as ``serve`` runs its clients; each answer is the one a request alone
    gets). Each costs one more sequence of the largest context in the engine's pools."""

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods:
            raise ValueError(f"EvalConfig.methods: unknown {bad or 'empty list'}; choose from {METHODS}")
        bad = [t for t in self.tasks if t not in TASKS + ("ppl",)]
        if bad or not self.tasks:
            raise ValueError(f"EvalConfig.tasks: unknown {bad or 'empty list'}; choose from {TASKS + ('ppl',)}")
        if not self.contexts or min(self.contexts) < 256:
            raise ValueError(f"EvalConfig.contexts must be >= 256 tokens, got {self.contexts}")
        if self.samples < 1:
            raise ValueError(f"EvalConfig.samples must be >= 1, got {self.samples}")
        if self.batch < 1:
            raise ValueError(f"EvalConfig.batch must be >= 1, got {self.batch}")
        if not self.windows:
            raise ValueError("EvalConfig.windows must hold True, False or both")
        bad = [h for h in self.haystacks if h not in HAYSTACKS]
        if bad or not self.haystacks:
            raise ValueError(f"EvalConfig.haystacks: unknown {bad or 'empty list'}; choose from {HAYSTACKS}")


ENGINE_METHODS = ("bf16", "int4", "naive", "quarot", "oscar")
"""KV methods the paged engine serves: per-token 2- or 4-bit history pages, each kind at its own
bits (``oscarkv.cache.paged_layout``), or BF16 only. ``kivi`` (per-channel keys) needs another page
format."""


@dataclass(frozen=True)
class EngineConfig:
    """The paged serving engine (``oscarkv.engine``): pools, scheduling and prefix caching."""

    kv: KVConfig = field(default_factory=KVConfig)
    """Storage rule and tier geometry; ``page_size`` is the page of every pool."""
    kv_memory_bytes: int = 1 << 30
    """One budget for all KV pools of one device (BF16 windows + INT2 history, every layer, K and V);
    with tensor parallelism each rank's pools get this much for its KV heads."""
    bf16_fraction: float | None = None
    """Share of ``kv_memory_bytes`` given to BF16 pages; ``None`` sizes the BF16 pool for
    ``max_num_seqs`` full windows plus one step's chunks and gives the rest to INT2."""
    max_num_seqs: int = 32
    """Sequences decoded together (the running batch)."""
    max_num_batched_tokens: int = 2048
    """Token budget of one step, decode tokens and prefill chunks together."""
    prefill_chunk: int = 512
    """Prefill chunks end at multiples of this many tokens (or the prompt's end). Chunk
    boundaries change what a chunk attends to at full precision, so they are a fixed function
    of the position: a prefix-cache hit and a preempted request replay them exactly."""
    enable_prefix_caching: bool = True
    """Share full pages between requests by content hash (per prefix and tier)."""
    seed: int = 0
    """Sampling seed of requests that do not set their own."""
    overlap: bool | None = None
    """Plan and launch the next decode step while the current one runs, so the host's work
    (scheduling, tables, sampling, detokenizing) hides behind the device's (``LLMEngine.step``);
    ``None``: on when the model runs on CUDA. The outputs are those of sequential steps (the row
    of a request that stopped is kept in the step launched ahead of it: its batch-mates' rounding
    may differ, as in a larger batch)."""
    tensor_parallel_size: int = 1
    """Devices the model is split over, Megatron style (``oscarkv.models.parallel``): the engine starts
    ranks 1 .. N-1 as worker processes of its own (``oscarkv.engine.workers``; CUDA: one GPU each from
    the model's, NCCL; CPU: gloo). Query and KV heads are split (a KV head is replicated when N exceeds
    their number); N must divide the query heads and the MLP width."""

    def __post_init__(self) -> None:
        kv, p = self.kv, self.kv.page_size
        if kv.method not in ENGINE_METHODS:
            raise ValueError(f"EngineConfig.kv.method must be one of {ENGINE_METHODS} for the paged engine, got {kv.method!r}")
        if kv.sink % p:
            raise ValueError(f"EngineConfig.kv.sink ({kv.sink}) must be a multiple of page_size ({p}): "
                             "sink pages are whole pages in the paged layout")
        if kv.method != "bf16" and kv.recent == 0 and p > 1:
            raise ValueError("EngineConfig.kv.recent must be >= 1 when page_size > 1: with no recent window a "
                             "decode step would demote the page that holds its own token")
        if self.prefill_chunk < 1 or self.prefill_chunk % p:
            raise ValueError(f"EngineConfig.prefill_chunk ({self.prefill_chunk}) must be a positive multiple of page_size ({p})")
        if self.max_num_seqs < 1:
            raise ValueError(f"EngineConfig.max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.prefill_chunk + self.max_num_seqs:
            raise ValueError(f"EngineConfig.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                             f"prefill_chunk + max_num_seqs ({self.prefill_chunk + self.max_num_seqs}) so prefill never starves")
        if self.bf16_fraction is not None and not 0 < self.bf16_fraction <= 1:
            raise ValueError(f"EngineConfig.bf16_fraction must lie in (0, 1], got {self.bf16_fraction}")
        if self.kv_memory_bytes <= 0:
            raise ValueError(f"EngineConfig.kv_memory_bytes must be > 0, got {self.kv_memory_bytes}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"EngineConfig.tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")


@dataclass(frozen=True)
class ServerConfig:
    """Network address, the served model's name, request limits, shutdown and access control of
    ``oscarkv serve``."""

    host: str = "127.0.0.1"
    """Interface to bind (loopback by default; ``0.0.0.0`` serves every interface)."""
    port: int = 8000
    """TCP port; ``0`` lets the OS pick a free one (the chosen port is logged)."""
    served_model_name: str = ""
    """The ``model`` id clients must send and ``/v1/models`` lists; empty: the ``--model`` spec."""
    max_model_len: int = 0
    """Longest sequence (prompt + generated tokens) a request may ask for; ``0``: the smaller of
    the model's ``max_position_embeddings`` and what the KV pools hold for one sequence."""
    default_max_tokens: int = 0
    """``max_tokens`` of requests that leave it out; ``0``: the rest of the context (vLLM's
    choice for chat), and 16 for ``/v1/completions`` (OpenAI's documented default)."""
    max_request_bytes: int = 16 << 20
    """Largest request body accepted; a larger one is answered 413 before it is parsed. 16 MiB
    holds a 1M-token prompt sent as token ids."""
    shutdown_grace: float = 30.0
    """Seconds a SIGTERM or SIGINT lets requests in flight finish (new ones are refused); those
    still running then end with an error event (a 503 before their response started)."""
    api_key: str = field(default="", repr=False)
    """Bearer token every ``/v1/*`` request must carry (``Authorization: Bearer KEY``); empty: no
    check. ``oscarkv serve`` also reads it from ``OSCARKV_API_KEY``, which keeps it out of
    process listings."""
    protect_metrics: bool = False
    """Ask for the API key on ``/metrics`` too (``/health`` is always open)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"ServerConfig.port must lie in [0, 65535], got {self.port}")
        if self.max_model_len < 0:
            raise ValueError(f"ServerConfig.max_model_len must be >= 0, got {self.max_model_len}")
        if self.default_max_tokens < 0:
            raise ValueError(f"ServerConfig.default_max_tokens must be >= 0, got {self.default_max_tokens}")
        if self.max_request_bytes < 1024:
            raise ValueError(f"ServerConfig.max_request_bytes must be >= 1024, got {self.max_request_bytes}")
        if not self.shutdown_grace >= 0:
            raise ValueError(f"ServerConfig.shutdown_grace must be >= 0 seconds, got {self.shutdown_grace}")
        if self.protect_metrics and not self.api_key:
            raise ValueError("ServerConfig.protect_metrics needs an api_key (--api-key or OSCARKV_API_KEY)")


@dataclass(frozen=True)
class ReferenceRecipe:
    """What the OSCAR reference's rotation files leave out (``oscarkv import-rotations``).

    The published files carry rotations only; clips, group size and windows come from this
    recipe, whose defaults are the reference's published ones. A value other than the default is
    recorded in the artifact's manifest as a model-specific override."""

    key_clip: float = 0.96
    """Clip ratio of the keys in every layer (the ⌊c·G⌋-th smallest |x| of a group bounds it)."""
    value_clip: float = 0.92
    """Clip ratio of the values in every layer."""
    group_size: int = 128
    """Channels per INT2 group; heads narrower than this use one group per head."""
    sink: int = 64
    """Leading tokens the reference keeps in BF16 (recorded; the engine's ``KVConfig.sink``)."""
    recent: int = 256
    """Most recent tokens the reference keeps in BF16 (recorded; the engine's ``KVConfig.recent``)."""

    def __post_init__(self) -> None:
        for name in ("key_clip", "value_clip"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"ReferenceRecipe.{name} must lie in (0, 1], got {getattr(self, name)}")
        if self.group_size < 4:
            raise ValueError(f"ReferenceRecipe.group_size must be >= 4, got {self.group_size}")
        if self.sink < 0 or self.recent < 0:
            raise ValueError(f"ReferenceRecipe.sink and recent must be >= 0, got {self.sink}, {self.recent}")
