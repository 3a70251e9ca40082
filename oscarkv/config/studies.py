"""Offline configuration: how the rotation artifact is fitted (``CalibrationConfig``), how the
recipe is chosen on development samples (``RecipeSearchConfig``), what an evaluation measures
(``EvalConfig``), and what the OSCAR reference's files leave out (``ReferenceRecipe``). Public
through :mod:`oscarkv.config`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from oscarkv.config.serving import LEVEL_KINDS, METHODS, RUNGS, KVConfig

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

DEV_PROTOCOLS = ("served", "forced")
"""How the recipe search scores a candidate (``RecipeSearchConfig.protocol``)."""

ALLOCATE_KINDS = ("key", "value", "key-heads")
"""What the recipe search may allocate 4 bits to (``RecipeSearchConfig.allocate``): a layer's keys, a layer's
values, one KV head's keys."""


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
    pages: tuple[int, ...] = (64,)
    """Candidate page sizes (tokens), each with every sink and recent window: smaller pages serve smaller windows
    (a sink of whole pages, a recent window rounded up to a page), whose bytes a per-head allocation spends on
    4-bit keys instead (``lab/results/gpu_heads_windows/``: pages of 16 chose the shipped recipe)."""
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
    large key components retrieval needs (lab/DEVELOPMENT.md)."""
    levels: tuple[str, ...] = ("uniform",)
    """Candidate 2-bit level tables (``LEVEL_KINDS``: ``uniform``, ``lloyd_max``: the artifact's per-layer
    Lloyd-Max tables, fitted first if it holds none), each with every window, rung and key clip; a chosen
    ``lloyd_max`` is recorded in the recipe (``levels``) and served (``KVConfig.levels``)."""

    allocate: tuple[str, ...] = ()
    """Kinds whose bits the search allocates (``ALLOCATE_KINDS``; ``oscarkv.eval.allocate``): ``key``, ``value``
    per layer; ``key-heads`` per KV head of each layer, 4-bit keys in that head alone (not with ``key``). Each
    unit's sensitivity is measured on the development samples (that unit alone at 4 bits), then, for every INT2
    candidate window, units are raised greedily, the largest gain first, within ``max_bpe``; the allocations are
    scored beside the uniform rungs and a chosen one is recorded in the recipe (``layer_key_bits``,
    ``layer_value_bits``, ``layer_key_heads``). Empty: no allocation."""

    def __post_init__(self) -> None:
        self._check_allocate()
        bad = [lv for lv in self.levels if lv not in LEVEL_KINDS]
        if bad or not self.levels:
            raise ValueError(f"RecipeSearchConfig.levels: unknown {bad or 'empty list'}; choose from {LEVEL_KINDS}")
        if self.max_bpe is not None and self.max_bpe <= 2:
            raise ValueError(f"RecipeSearchConfig.max_bpe must exceed 2 bits, got {self.max_bpe}")
        if self.tolerance is not None and not 0 <= self.tolerance < 1:
            raise ValueError(f"RecipeSearchConfig.tolerance must lie in [0, 1), got {self.tolerance}")
        if any(not 0 < c <= 1 for c in self.key_clips):
            raise ValueError(f"RecipeSearchConfig.key_clips must lie in (0, 1], got {self.key_clips}")
        bad = [r for r in self.rungs if r not in RUNGS]
        if bad or not self.rungs:
            raise ValueError(f"RecipeSearchConfig.rungs: unknown {bad or 'empty list'}; choose from {tuple(RUNGS)}")
        if not self.pages or any(p < 1 for p in self.pages):
            raise ValueError(f"RecipeSearchConfig.pages must be page sizes >= 1 (--pages), got {self.pages}")
        if self.protocol not in DEV_PROTOCOLS:
            raise ValueError(f"RecipeSearchConfig.protocol must be one of {DEV_PROTOCOLS}, got {self.protocol!r}")
        if self.dev_samples < len(self.dev_seeds) or not self.dev_seeds:
            raise ValueError(f"RecipeSearchConfig.dev_samples ({self.dev_samples}) must give every one of "
                             f"RecipeSearchConfig.dev_seeds {self.dev_seeds} a sample")

    def _check_allocate(self) -> None:
        bad = [k for k in self.allocate if k not in ALLOCATE_KINDS]
        if bad:
            raise ValueError(f"RecipeSearchConfig.allocate: unknown {bad}; choose from {ALLOCATE_KINDS}")
        if self.allocate and self.max_bpe is None:
            raise ValueError(f"RecipeSearchConfig.allocate {self.allocate} needs RecipeSearchConfig.max_bpe (the budget)")
        if {"key", "key-heads"} <= set(self.allocate):
            raise ValueError("RecipeSearchConfig.allocate: key and key-heads both raise keys (a 4-bit layer has no "
                             "2-bit heads to raise); give one of them")


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
            raise ValueError(f"CalibrationConfig.tokens ({self.tokens}) must be >= CalibrationConfig.chunk "
                             f"({self.chunk}) >= 16")


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
            raise ValueError(f"ReferenceRecipe.sink and ReferenceRecipe.recent must be >= 0, got {self.sink}, {self.recent}")
