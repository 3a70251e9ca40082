"""Serving configuration: how the KV cache is stored (``KVConfig``) and how the paged engine runs
(``EngineConfig``), with the names they validate against; what the HTTP layer and its replicas add is
:mod:`oscarkv.config.server`. Public through :mod:`oscarkv.config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

CACHE_DIR = Path.home() / ".cache" / "oscarkv"
"""Default home of derived files: converted GGUF models and the default model's artifact."""

DTYPES = ("auto", "bfloat16", "float32")
"""Model compute dtypes by name; ``auto``: bfloat16 where a GPU runs the model, float32 where a CPU does
(``oscarkv.models.loader.resolve_dtype``)."""

DEVICES = ("auto", "cpu", "cuda")
"""Where a loaded model runs; ``auto``: the first CUDA device when one is visible, else the CPU
(``oscarkv.models.loader.resolve_device``). The engine runs where the model's weights are."""

METHODS = ("bf16", "int4", "naive", "quarot", "kivi", "oscar")
"""KV storage methods, all served by one codec path (``oscarkv.quant.codec``)."""

LADDER_METHODS = ("naive", "quarot", "oscar")
"""Per-token methods whose key and value bits ``KVConfig.key_bits``/``value_bits`` choose."""

FIXED_BITS = ("bf16", "int4", "kivi")
"""Methods with their own bits (none, 4/4 without rotation, KIVI's 2/2)."""

LEVEL_KINDS = ("uniform", "lloyd_max")
"""The 2-bit level tables ``KVConfig.levels`` chooses from (``oscarkv.quant.int2``)."""

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
    levels: str = "uniform"
    """The values a 2-bit code stands for, one of ``LEVEL_KINDS``: ``uniform`` (0, 1, 2, 3 steps of the
    group's scale, the validated recipe) or, for ``oscar`` only, ``lloyd_max``: the artifact's per-layer key
    and value tables (0, l1, l2, 3), fitted by Lloyd-Max with fixed endpoints on the calibration data as
    the codec normalizes it (``oscarkv.calibrate.levels``), the recipe search's choice
    (``RecipeSearchConfig.levels``). 4-bit kinds stay uniform."""

    layer_key_bits: tuple[int, ...] = ()
    """Per-layer key bits, one per decoder layer (2 or 4), for the per-token methods: a precision allocation
    (``oscarkv calibrate --allocate``) that spends 4-bit keys where a layer's retrieval needs them; empty:
    every layer at ``key_bits``. The artifact's recipe carries it (``recipe.layer_key_bits``)."""
    layer_value_bits: tuple[int, ...] = ()
    """Per-layer value bits, one per decoder layer (2 or 4); empty: every layer at ``value_bits``."""
    layer_key_heads: tuple[tuple[int, ...], ...] = ()
    """A per-KV-head key allocation, one entry per decoder layer: the KV heads whose keys that layer stores at 4
    bits, the others at the layer's key bits (which must then be 2); empty: none. Spends 4-bit keys on the heads
    whose retrieval needs them (``oscarkv calibrate --allocate key-heads``); the engine serves each layer as two
    head ranges (``oscarkv.cache.kv_pools``). The artifact's recipe carries it (``recipe.layer_key_heads``)."""

    def __post_init__(self) -> None:
        self._check_layer_bits()
        if self.levels not in LEVEL_KINDS or (self.levels != "uniform" and self.method != "oscar"):
            raise ValueError(f"KVConfig.levels must be one of {LEVEL_KINDS} ('lloyd_max' needs method 'oscar', whose "
                             f"artifact holds the tables), got {self.levels!r} for {self.method!r}")
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

    def _check_layer_bits(self) -> None:
        for name in ("layer_key_bits", "layer_value_bits"):
            vals = getattr(self, name)
            if vals and (self.method not in LADDER_METHODS or any(b not in (2, 4) for b in vals)):
                raise ValueError(f"KVConfig.{name} holds 2 or 4 per layer and applies to {LADDER_METHODS}, got "
                                 f"{vals} for {self.method!r}")
        sizes = {len(v) for v in (self.layer_key_bits, self.layer_value_bits, self.layer_key_heads) if v}
        if len(sizes) > 1:
            raise ValueError(f"KVConfig.layer_key_bits, layer_value_bits and layer_key_heads must name the same layers, "
                             f"got {len(self.layer_key_bits)}, {len(self.layer_value_bits)} and "
                             f"{len(self.layer_key_heads)} values")
        self._check_key_heads()

    def _check_key_heads(self) -> None:
        if not self.layer_key_heads:
            return
        if self.method not in LADDER_METHODS:
            raise ValueError(f"KVConfig.layer_key_heads applies to {LADDER_METHODS}, got method {self.method!r}")
        for i, heads in enumerate(self.layer_key_heads):
            if any(not isinstance(h, int) or h < 0 for h in heads) or len(set(heads)) != len(heads):
                raise ValueError(f"KVConfig.layer_key_heads[{i}]: distinct KV head indices >= 0 expected, got {heads}")
            if heads and self.layer_bits(i)[0] != 2:
                raise ValueError(f"KVConfig.layer_key_heads[{i}] lists heads {heads}, but layer {i} stores "
                                 f"{self.layer_bits(i)[0]}-bit keys in every head: per-head 4-bit keys refine 2-bit layers")

    def layer_bits(self, layer: int) -> tuple[int, int]:
        """``(key_bits, value_bits)`` of decoder layer ``layer``: the per-layer allocation where one is set."""
        kb = self.layer_key_bits[layer] if self.layer_key_bits else self.key_bits
        return kb, self.layer_value_bits[layer] if self.layer_value_bits else self.value_bits

    def key_heads(self, layer: int) -> tuple[int, ...]:
        """The KV heads of decoder layer ``layer`` whose keys are stored at 4 bits by a per-head allocation."""
        return tuple(sorted(self.layer_key_heads[layer])) if self.layer_key_heads else ()

    def _num_layers(self) -> int:
        return max(len(self.layer_key_bits), len(self.layer_value_bits), len(self.layer_key_heads))

    @property
    def allocated(self) -> bool:
        """Whether a per-layer allocation sets some layer's bits (``layer_key_bits``/``layer_value_bits``) or a
        per-head one some heads' (``layer_key_heads``)."""
        return bool(self.layer_key_bits or self.layer_value_bits or self.layer_key_heads)

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
        is named after the method (``oscar-k4v2+win``); a per-layer allocation counts its 4-bit layers
        (``oscar-k4x5+win``: five layers with 4-bit keys), a per-head one its 4-bit key heads (``oscar-kh4x33+win``); Lloyd-Max levels add ``-lm`` (``oscar-lm+win``)."""
        if self.method == "bf16":
            return "bf16"
        name = self.method if self.bits == (2, 2) or self.method in FIXED_BITS else f"{self.method}-{self.rung()}"
        if self.allocated:  # e.g. oscar-k4x5: five layers hold 4-bit keys, the others the base bits
            fours = [sum(self.layer_bits(i)[j] == 4 for i in range(self._num_layers())) for j in (0, 1)]
            name = self.method + "".join(f"-{kind}4x{n}" for kind, n in zip("kv", fours) if n)
            name += f"-kh4x{sum(map(len, self.layer_key_heads))}" if self.layer_key_heads else ""
        name += "-lm" if self.levels == "lloyd_max" else ""
        return f"{name}+win" if (self.sink or self.recent) else name


ENGINE_METHODS = ("bf16", "int4", "naive", "quarot", "oscar")
"""KV methods the paged engine serves: per-token 2- or 4-bit history pages, each kind at its own
bits (``oscarkv.cache.paged_layout``), or BF16 only. ``kivi`` (per-channel keys) needs another page
format."""


SPECULATIVE_METHODS = ("none", "ngram")
"""Speculative decoding methods of the paged engine: ``ngram`` drafts by prompt lookup (no draft model)."""
TP_ALL_REDUCES = ("auto", "nccl", "one_shot", "two_shot", "one_shot_norm")

PIECEWISE_BUCKETS = (64, 128, 256, 512)
"""``EngineConfig.piecewise_graph_buckets`` by default: the prompt chunks of ``serve`` and follow-ups
up to 512 tokens. A cold 32K prompt in 512-token chunks (Qwen3-4B shape, one H200, 2026-11-28): BF16 2.7 s eager,
1.33 s in pieces; OSCAR 3.6 / 1.66 s (``lab.scripts.pieces_check``)."""

L2_PREFETCH_POINTS = ("attn", "reduce", "act", "next")
"""Where a decode step may prefetch the next projection's weights into L2 (``oscarkv.models.prefetch``)."""


def prefetch_points(spec: str) -> tuple[str, ...]:
    """``EngineConfig.l2_prefetch`` as points: ``off`` none, ``all`` every one, else a list of
    :data:`L2_PREFETCH_POINTS` joined by ``,`` or ``+``; a ValueError names the flag."""
    if spec in ("", "off"):
        return ()
    names = L2_PREFETCH_POINTS if spec == "all" else tuple(s.strip() for s in spec.replace("+", ",").split(","))
    bad = [n for n in names if n not in L2_PREFETCH_POINTS]
    if bad:
        raise ValueError(f"EngineConfig.l2_prefetch (--l2-prefetch): unknown point(s) {bad}; use off, all or a "
                         f"comma-separated list of {', '.join(L2_PREFETCH_POINTS)}")
    return names
"""All-reduces of the row-parallel projections (``oscarkv.models.allreduce``)."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding in the paged engine (``oscarkv.engine.speculative``): a decode step of a
    sequence with drafts verifies them in one step; greedy outputs are those without speculation, and
    sampled ones keep their distribution (rejection sampling)."""

    method: str = "none"
    """One of ``SPECULATIVE_METHODS``: ``none``, or ``ngram`` (prompt lookup: the tokens that followed the
    last earlier occurrence of the sequence's last n tokens, in its own prompt and output)."""
    num_speculative_tokens: int = 4
    """Drafted tokens verified per step and sequence, at most (K: a verify step computes up to K + 1 tokens)."""
    prompt_lookup_min: int = 1
    """Shortest n-gram matched (the longest is tried first)."""
    prompt_lookup_max: int = 4
    """Longest n-gram matched."""
    min_accepted_tokens: float = 0.45
    """A sequence drafts while its recent accepted drafts per verify step (an exponential average) are at least this.
    Below it, and from its first step, it drafts in *shadow* only: the drafts a step would propose are judged
    against the tokens it then emits (no verify step, its steps run ahead), and one judged at this many or more
    resumes drafting, so text that does not copy costs plain decode steps; 0 always drafts. A verify step pays when
    it accepts more than its cost in plain steps, less one. Chosen over a share of the drafts (0.25) on development
    text (``lab/results/draft_gate_floor/``) and kept at step costs measured on an H200 (``draft_gate_floor_s27/``:
    0.7-1.3 gain nothing there); where verify steps cost more than about twice a plain step (a small host-bound
    model), 1.3 or ``measured_floor`` can spare text that copies little. Outputs do not depend on it."""
    measured_floor: bool = False
    """Set the floor from this engine's own steps instead: where a verify step breaks even, (its wall time + that of
    the plain step after it, which cannot run ahead) / a plain step run ahead's − 2 (averages), once four verify and
    four plain steps ran (``min_accepted_tokens`` before). Greedy outputs do not depend on it; seeded sampled ones
    then depend on timing (which steps verify)."""

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"SpeculativeConfig.method must be one of {SPECULATIVE_METHODS}, got {self.method!r}")
        if self.num_speculative_tokens < 1:
            raise ValueError(f"SpeculativeConfig.num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if not 0.0 <= self.min_accepted_tokens <= self.num_speculative_tokens:
            raise ValueError("SpeculativeConfig.min_accepted_tokens must be in [0, "
                             f"SpeculativeConfig.num_speculative_tokens ({self.num_speculative_tokens})], got {self.min_accepted_tokens}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("SpeculativeConfig needs 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                             f"{self.prompt_lookup_min} and {self.prompt_lookup_max}")

    @property
    def enabled(self) -> bool:
        return self.method != "none"


@dataclass(frozen=True)
class DistributedConfig:
    """Where the tensor-parallel ranks of one engine run: one host (the default) or several, joined by
    torch.distributed's TCP rendezvous (``oscarkv.engine.workers``). Node ``n`` of ``nnodes`` hosts ranks
    ``[n k, (n + 1) k)``, ``k = tensor_parallel_size / nnodes``; node 0 runs the engine (rank 0 schedules),
    the others only their ranks' shards, which they receive from rank 0."""

    nnodes: int = 1
    """Hosts the ranks are spread over; they must divide ``tensor_parallel_size``."""
    node_rank: int = 0
    """This host's index in ``[0, nnodes)``: 0 serves (and sends every rank its weights), the others wait for it."""
    master_addr: str = "127.0.0.1"
    """Address of node 0, which every node can reach (node 0 listens there for the rendezvous)."""
    master_port: int = 29500
    """TCP port of the rendezvous on node 0 (torch.distributed's usual one)."""
    rendezvous_timeout: float = 300.0
    """Seconds the nodes wait for one another at start-up; a node that has not arrived by then fails the
    start with an error naming the address (a node that dies later fails the running steps at once)."""

    def __post_init__(self) -> None:
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"DistributedConfig: node_rank must lie in [0, nnodes), got node_rank={self.node_rank}, "
                             f"nnodes={self.nnodes}")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"DistributedConfig.master_port must lie in [1, 65535], got {self.master_port}")
        if not self.rendezvous_timeout > 0:
            raise ValueError(f"DistributedConfig.rendezvous_timeout must be > 0 seconds, got {self.rendezvous_timeout}")


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
    ``max_num_seqs`` full windows plus one step's chunks (and ``prefix_windows``) and gives the rest to INT2."""
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
    resume_turns: bool = True
    """In a chat prompt, start a prefill chunk where each earlier turn's prompt ended (rounded down to a page: found
    by the chat template's assistant prefix), so a follow-up turn hits the cached last chunk of the turn before
    instead of recomputing it. A function of the prompt (a cold run computes the same); single-turn prompts are
    unchanged."""
    resume_questions: bool = True
    """Also start a chunk where a long single-turn prompt's last line begins (rounded down to a page; an engine with
    a tokenizer and prefix caching), so another question on the same document (a new chat, or plain text) recomputes
    its own line, not up to ``prefill_chunk`` tokens of the document before it (100K tokens, H200: first token 82 ->
    34 ms via ``LLM``). A cold prompt pays at most one more step (none at 32K and 100K in ``lab.scripts.resume_cold``).
    The question then reads the document tokens before it beyond the recent window as stored, as a follow-up turn
    does; on development needles as served (default model, shipped recipe, H200, 2026-11-29,
    ``lab.scripts.resume_questions_ab``, ``lab/results/resume_questions_ab``) found % without / with: 98.75 / 98.75
    at 4K and 59.4 / 66.3 at 8K (160 each), multi-key 32.5 / 31.3 at 4K (80)."""
    prefix_windows: int = 4
    """With prefix caching and a quantized cache: BF16 room for this many cached windows (sink and recent pages)
    beyond what the running sequences need. A hit needs the BF16 window at its chunk start; without the room a
    follow-up longer than the free pages evicts the window the next follow-up on the same document would hit."""
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
    their number); N must divide the query heads and the MLP width. On several hosts (``distributed``) node 0
    starts its share of the ranks and the other nodes theirs."""
    tensor_parallel_all_reduce: str = "auto"
    """The all-reduce of the row-parallel projections with ``tensor_parallel_size > 1``
    (``oscarkv.models.allreduce``): ``nccl`` (gloo on the CPU); ``one_shot`` or ``two_shot`` over
    peer-to-peer symmetric memory for decode-sized messages, NCCL above (CUDA); ``one_shot_norm``: ``one_shot``,
    and in Llama-style models the sum fused with the next residual add and RMSNorm (one kernel); ``auto``: the kind
    measured fastest for the number of GPUs (``allreduce.SYMM_MEM_WINS``), else NCCL."""
    extend_graph_buckets: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    """Token buckets of the CUDA graphs of short extend steps of one sequence (a follow-up's first step over a
    cached prefix, a speculative verify chunk; ``oscarkv.engine.extend_graphs``): a step of ``k`` tokens replays
    the smallest bucket ``>= k``, padded. Used with the decode graphs (CUDA, the Triton backend); empty: such
    steps run eagerly."""
    piecewise_graph_buckets: tuple[int, ...] | None = None
    """Token buckets of the piecewise CUDA graphs of one sequence's longer extend steps (a 512-token prompt chunk,
    a long follow-up; ``oscarkv.engine.piecewise``): every layer's work but its attention replayed, attention run
    eagerly between the pieces (without CUDA: the same steps eagerly over the padded buffers); empty: such steps
    run eagerly; unset (``None``): 64, 128, 256, 512 (``PIECEWISE_BUCKETS``) with CUDA graphs (under tensor
    parallelism too) and ``l2_prefetch`` off, else empty."""
    piecewise_batches: bool = True
    """The piecewise graphs also serve steps of several sequences (a prompt chunk beside other requests' decode
    tokens, up to the largest bucket, with one more bucket for a chunk beside ``max_num_seqs`` decoding tokens where
    the chunk fits the buckets: ``runner_build.piece_buckets``), attention with the step's tables. Two cold 16K
    prompts arriving while a request decodes (one H200, 2026-11-28, ``lab.scripts.pieces_batch_check``): TTFT BF16
    2.6 / 6.6 s eager, 1.1 / 2.1 s so; the decoder's steps meanwhile 59 -> 30 ms (OSCAR 2.0 / 6.9 -> 1.2 / 2.4 s,
    61 -> 35 ms)."""
    l2_prefetch: str = "off"
    """Prefetch each projection's weights into L2 while the latency-bound work before it runs (CUDA, compute
    capability 9.0+; ``oscarkv.models.prefetch``): ``off``, ``all``, or a comma list of ``attn`` (o_proj during
    attention), ``reduce`` (gate_up during o_proj's all-reduce and the norm), ``act`` (down_proj during SiLU·mul),
    ``next`` (the next layer's qkv during down_proj's all-reduce and the norm). Outputs do not change. An
    experiment: every point slowed Qwen3-4B/8B decode at 100K on H200s, one GPU and two (2026-11-28,
    docs/BENCHMARKS.md), so it stays off."""
    l2_prefetch_mib: int = 24
    """Bytes prefetched at each point, at most (MiB; the first bytes of the weight)."""
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    """Speculative decoding (off by default). With ``overlap`` a step is planned ahead only while none of its
    sequences may draft (drafts and a verify step's plan need the tokens on the host)."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Hosts the ranks run on (one by default)."""

    def __post_init__(self) -> None:
        kv, p = self.kv, self.kv.page_size
        if kv.method not in ENGINE_METHODS:
            raise ValueError(f"EngineConfig.kv.method must be one of {ENGINE_METHODS} for the paged engine, got {kv.method!r}")
        if kv.sink % p:
            raise ValueError(f"EngineConfig.kv.sink ({kv.sink}) must be a multiple of EngineConfig.kv.page_size ({p}): "
                             "sink pages are whole pages in the paged layout")
        if kv.method != "bf16" and kv.recent == 0 and p > 1:
            raise ValueError("EngineConfig.kv.recent must be >= 1 when EngineConfig.kv.page_size > 1: with no recent window a "
                             "decode step would demote the page that holds its own token")
        if self.prefill_chunk < 1 or self.prefill_chunk % p:
            raise ValueError(f"EngineConfig.prefill_chunk ({self.prefill_chunk}) must be a positive multiple of "
                             f"EngineConfig.kv.page_size ({p})")
        if self.max_num_seqs < 1:
            raise ValueError(f"EngineConfig.max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.prefill_chunk + self.max_num_seqs:
            raise ValueError(f"EngineConfig.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                             f"EngineConfig.prefill_chunk + EngineConfig.max_num_seqs ({self.prefill_chunk + self.max_num_seqs}) "
                             "so prefill never starves")
        if self.bf16_fraction is not None and not 0 < self.bf16_fraction <= 1:
            raise ValueError(f"EngineConfig.bf16_fraction must lie in (0, 1], got {self.bf16_fraction}")
        if self.prefix_windows < 0:
            raise ValueError(f"EngineConfig.prefix_windows must be >= 0, got {self.prefix_windows}")
        if self.kv_memory_bytes <= 0:
            raise ValueError(f"EngineConfig.kv_memory_bytes must be > 0, got {self.kv_memory_bytes}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"EngineConfig.tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.tensor_parallel_all_reduce not in TP_ALL_REDUCES:
            raise ValueError(f"EngineConfig.tensor_parallel_all_reduce must be one of {TP_ALL_REDUCES}, "
                             f"got {self.tensor_parallel_all_reduce!r}")
        prefetch_points(self.l2_prefetch)
        if self.l2_prefetch_mib < 1:
            raise ValueError(f"EngineConfig.l2_prefetch_mib (--l2-prefetch-mib) must be >= 1, got {self.l2_prefetch_mib}")
        if self.piecewise_graph_buckets and self.l2_prefetch != "off":
            raise ValueError("EngineConfig.piecewise_graph_buckets with EngineConfig.l2_prefetch: a prefetch's side "
                             "stream would span a piece's end; turn one of them off")
        for name in ("extend_graph_buckets", "piecewise_graph_buckets"):
            if any(b < 2 for b in getattr(self, name) or ()):
                raise ValueError(f"EngineConfig.{name} must be token counts >= 2 (one token is a decode step), "
                                 f"got {getattr(self, name)}")
        if self.tensor_parallel_size % self.distributed.nnodes:
            raise ValueError(f"EngineConfig.tensor_parallel_size ({self.tensor_parallel_size}) must be a multiple of "
                             f"DistributedConfig.nnodes ({self.distributed.nnodes}): every node hosts as many ranks")
