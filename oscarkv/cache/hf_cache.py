"""A transformers ``Cache`` that stores the mixed-precision tiers of DESIGN.md §3 for real.

Role: run ``model.generate(..., cache=OscarCache(...))`` on any transformers model
with the storage rule of a :class:`~oscarkv.quant.codec.KVCodec`, holding the bytes the
engine would hold, so accuracy and memory can be measured without the paged engine.

Data owned, per layer, per batch row, per tensor kind (K or V), by :class:`_TierStore`:

- sink ``[0, S0)`` and recent window ``[h, t)``: rotated, centered values in BF16
  (``codec.to_rotated(x).bfloat16()``), ``h = history_end(t, ...)``;
- history ``[S0, h)``: :class:`~oscarkv.quant.int2.Packed` blocks of whole ``page_size``-token
  pages, aligned at ``S0`` (so KIVI's per-channel key blocks are pages). A page is encoded
  once, when it enters the history, and never re-quantized.

Demotion source (NOTE: an invariant the tests rely on): every history page is encoded from
the BF16-rounded rotated values, ``encode(bf16(to_rotated(x)))`` — the value the recent
window holds — whether the token waited in the window (decode) or is demoted in the call it
arrives in (prompt middles). So a stored page depends only on its tokens' BF16 rotated
values, never on how the sequence was chunked: chunked prefill ≡ unchunked prefill (bit for
bit where the rotation matmul is batch-invariant), and a page can be content-hashed for
prefix caching (DESIGN.md §3). Encoding prompt middles from full precision instead would
make a page straddling a chunk boundary differ from the same page prefilled at once.

``update`` first writes the chunk (including any demotion the new length triggers), then
returns ``[B, H, t, d]``: the cached prefix *as stored now* (history dequantized, windows
widened from BF16, all mapped back with ``from_rotated`` and cast to the input dtype),
followed by the chunk's own K/V exactly as given. So a prefill chunk attends to itself at
full precision and every later step reads the cache as stored, with the tiers of the new
length — the tier rule of the decode-faithful simulation (``oscarkv.eval.faithful``).

``dequant_cache=True`` keeps each block's dequantized values (input dtype) next to its codes,
filled once when the block is stored, so a decode step copies them instead of decoding the
whole history again (3-7x faster per decode step at 2K tokens, CPU, one thread). It costs
``itemsize`` bytes per element against ``bits/8 + 4/G`` for the codes — 6.4x the history
bytes for a BF16 model at INT2, G = 64 — reported apart as ``memory_bytes()["dequant_cache"]``.
The default ``False`` keeps memory honest. Both modes give bit-identical outputs.

A ``bits=None`` codec (method ``bf16``) stores K/V as given, in the model dtype, with no
rotation: it is then bit-identical to ``DynamicCache``.

Batches: every row must have the same length (no padding, or the usual generate case of
equal-length prompts). Left padding runs, but pad tokens count as tokens for the tier rule,
so a padded row's tiers are shifted. Beam search, cropping and batch reordering are not
supported (they would need re-quantization or per-row tier bookkeeping) and raise.

Sliding-window layers (Gemma 3, ``codec.sliding``) are :class:`WindowLayer` s: transformers'
``DynamicSlidingWindowLayer`` (the last ``W − 1`` tokens, the chunk as given), their tokens kept in
BF16 for a quantized codec — the engine's window pool — and as given for ``bf16``.

Where it goes next: the returned K/V feed the model's attention; ``memory_bytes``/``bpe``
feed the evaluation reports; the engine's paged caches must agree with it token for token.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicSlidingWindowLayer

from oscarkv.config import KVConfig
from oscarkv.quant.artifact import Artifact, ModelFingerprint, apply_recipe
from oscarkv.quant.bpe import SlidingLayers, Tiers, history_end, tiers
from oscarkv.quant.codec import KVCodec, LayerCodec, TensorCodec, build_codec
from oscarkv.quant.int2 import Packed

TIERS = ("sink", "history", "recent")


class _TierStore:
    """Sink, packed history blocks and recent window of one tensor kind of one batch row.

    History is a list of blocks, each a whole number of pages encoded in one call: all pages
    that one ``append`` demotes for a per-token codec (its codes are per token, so one call
    equals a call per page, bit for bit, and a 4K-token prompt with page size 1 is one call,
    not 4,096), exactly one page per block for a per-channel codec (KIVI's token blocks)."""

    def __init__(self, codec: TensorCodec, kv: KVConfig, dtype: torch.dtype, dequant_cache: bool) -> None:
        self.codec, self.kv, self.dtype = codec, kv, dtype
        self.length = 0
        self.sink: torch.Tensor | None = None  # [s, H, d] bf16, rotated
        self.recent: torch.Tensor | None = None  # [r, H, d] bf16, rotated
        self.blocks: list[Packed] = []  # whole pages each, in position order
        self.block_lens: list[int] = []  # tokens per block
        self.dequant: list[torch.Tensor] | None = [] if dequant_cache else None  # [n, H, d] per block

    @property
    def history(self) -> int:
        return sum(self.block_lens)

    def append(self, x: torch.Tensor) -> None:
        """Write ``x [T, H, d]`` (original domain) and demote the pages the new length sends to history."""
        c = self.kv
        rot = self.codec.to_rotated(x).bfloat16()  # [T, H, d]: every tier starts from these values
        if self.sink is None:
            self.sink = self.recent = rot[:0]
        t0, t1 = self.length, self.length + x.shape[0]
        n_sink = min(t1, c.sink) - min(t0, c.sink)
        self.sink = torch.cat([self.sink, rot[:n_sink]])
        self.length = t1
        tail = torch.cat([self.recent, rot[n_sink:]])  # positions [t1 - len(tail), t1)
        n_demote = history_end(t1, c.sink, c.recent, c.page_size) - (t1 - tail.shape[0])
        step = c.page_size if self.codec.per_channel else max(n_demote, 1)
        for s in range(0, n_demote, step):
            self._store_block(tail[s:s + step].float())
        # clone: a view would keep the demoted BF16 page alive (and memory_bytes would not see it)
        self.recent = tail[n_demote:].clone() if n_demote else tail

    def _store_block(self, rot: torch.Tensor) -> None:
        block = self.codec.encode(rot)
        self.blocks.append(block)
        self.block_lens.append(rot.shape[0])
        if self.dequant is not None:
            self.dequant.append(self._decode(block))

    def _decode(self, block: Packed) -> torch.Tensor:
        """A block mapped back to the original domain, ``[n, H, d]`` in the model dtype."""
        return self.codec.from_rotated(self.codec.decode(block)).to(self.dtype)

    def read_into(self, dst: torch.Tensor) -> None:
        """Write the first ``n`` stored tokens, as attention must see them, into ``dst [n, H, d]``.

        Each tier is mapped back and copied once into the caller's output (no concatenations)."""
        n = dst.shape[0]
        pos = min(n, self.sink.shape[0])
        dst[:pos] = self.codec.from_rotated(self.sink[:pos])
        for i, m in enumerate(self.block_lens):
            if pos >= n:
                return
            block = self.dequant[i] if self.dequant is not None else self._decode(self.blocks[i])
            m = min(m, n - pos)
            dst[pos:pos + m] = block[:m]
            pos += m
        dst[pos:] = self.codec.from_rotated(self.recent[:n - pos])

    def tiers(self) -> Tiers:
        return Tiers(self.sink.shape[0], self.history, self.recent.shape[0])

    def memory_bytes(self) -> dict[str, int]:
        extra = sum(t.numel() * t.element_size() for t in self.dequant or [])
        return {"sink": _nbytes(self.sink), "history": sum(p.nbytes() for p in self.blocks),
                "recent": _nbytes(self.recent), "dequant_cache": extra}


def _takes_cache_argument() -> bool:
    import transformers

    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", transformers.__version__).groups())
    return (major, minor) >= (5, 24)


CACHE_ARGUMENT = "cache" if _takes_cache_argument() else "past_key_values"
"""The name under which a transformers model's ``forward``/``generate`` takes its KV cache: ``cache`` from
5.24 on (``past_key_values`` is deprecated there and removed in 5.40), ``past_key_values`` before.
NOTE: an older release swallows an unknown ``cache=`` into ``**kwargs`` and runs without a cache."""


def cache_kwargs(cache) -> dict:
    """``{CACHE_ARGUMENT: cache}``: pass a KV cache to a transformers model under the installed release's name."""
    return {CACHE_ARGUMENT: cache}


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


class OscarLayer(CacheLayerMixin):
    """One model layer's cache: a K and a V :class:`_TierStore` per batch row.

    For a ``bits=None`` codec it keeps ``keys``/``values`` ``[B, H, T, d]`` exactly like
    ``DynamicLayer`` (no rotation, model dtype)."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, codec: LayerCodec, kv: KVConfig, dequant_cache: bool = False) -> None:
        super().__init__()
        self.codec, self.kv, self.dequant_cache = codec, kv, dequant_cache
        self.length = 0
        self.rows: list[tuple[_TierStore, _TierStore]] = []

    @property
    def quantized(self) -> bool:
        return self.codec.key.bits is not None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        self.token_elements = b * (h * d + value_states.shape[1] * value_states.shape[3])  # K+V, all rows
        if self.quantized:
            self.rows = [(self._store(self.codec.key), self._store(self.codec.value)) for _ in range(b)]
        else:
            self.keys, self.values = key_states[:, :, :0], value_states[:, :, :0]
        self.is_initialized = True

    def _store(self, codec: TensorCodec) -> _TierStore:
        return _TierStore(codec, self.kv, self.dtype, self.dequant_cache)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``[B, H, T, d]`` post-RoPE keys and values; return the K/V attention must use."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[0] != self._batch():
            raise ValueError(f"OscarLayer: batch size changed from {self._batch()} to {key_states.shape[0]}")
        self.length += key_states.shape[-2]
        if not self.quantized:
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            return self.keys, self.values
        return self._write_read(0, key_states), self._write_read(1, value_states)

    def _write_read(self, kind: int, x: torch.Tensor) -> torch.Tensor:
        """Write chunk ``x [B, H, T, d]`` (kind 0: K, 1: V) to every row; return ``[B, H, t, d]``:
        the stored prefix, then ``x`` exactly as given."""
        t0 = self.length - x.shape[-2]
        out = x.new_empty(*x.shape[:2], self.length, x.shape[-1])
        out[:, :, t0:] = x
        for row, xb, ob in zip(self.rows, x, out):
            row[kind].append(xb.transpose(0, 1))
            row[kind].read_into(ob[:, :t0].transpose(0, 1))  # a [t0, H, d] view of the output
        return out

    def _batch(self) -> int:
        return len(self.rows) if self.quantized else self.keys.shape[0]

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return -1  # grows without bound

    def reset(self) -> None:
        self.rows, self.keys, self.values = [], None, None
        self.length, self.is_initialized = 0, False

    def tiers(self) -> Tiers:
        """Tokens per tier (equal for every row, and for K and V)."""
        if not self.quantized:  # nothing is demoted; report what the tier rule would hold
            return tiers(self.length, self.kv.sink, self.kv.recent, self.kv.page_size)
        return self.rows[0][0].tiers() if self.rows else Tiers(0, 0, 0)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held per tier over rows, K and V (``dequant_cache``: the optional decoded copy)."""
        total = dict.fromkeys((*TIERS, "dequant_cache"), 0)
        if not self.quantized:
            for name, n in zip(TIERS, self.tiers()):  # every tier held as given; split by the tier rule
                total[name] = n * self.token_elements * self.dtype.itemsize if n else 0
            return total
        for store in (s for row in self.rows for s in row):
            for name, n in store.memory_bytes().items():
                total[name] += n
        return total

    def num_elements(self) -> int:
        """K and V elements cached (what a dense cache would hold)."""
        return self.length * self.token_elements if self.is_initialized else 0

    def _unsupported(self, what: str) -> None:
        raise NotImplementedError(f"OscarCache does not support {what}: stored pages would have to be moved "
                                  "or re-quantized; use greedy or sampling generate without beams or assistants")

    def crop(self, tokens_to_remove: int) -> None:
        self._unsupported("crop (assisted decoding)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._unsupported("reorder_cache (beam search)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length:
            self._unsupported("batch_repeat_interleave")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length:
            self._unsupported("batch_select_indices")


class WindowLayer(DynamicSlidingWindowLayer):
    """A sliding-window layer: the last ``window - 1`` tokens in ``dtype`` (``None``: as given); returns the
    stored window (in the input dtype) followed by the chunk as given, like its base class."""

    def __init__(self, window: int, dtype: torch.dtype | None) -> None:
        super().__init__(sliding_window=window)
        self.store_dtype = dtype

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        k = torch.cat([self.keys.to(key_states.dtype), key_states], dim=-2)  # [B, H, n + T, d]
        v = torch.cat([self.values.to(value_states.dtype), value_states], dim=-2)
        dtype = self.store_dtype or key_states.dtype
        self.keys, self.values = k[:, :, 1 - self.sliding_window:].to(dtype), v[:, :, 1 - self.sliding_window:].to(dtype)
        return k, v

    def memory_bytes(self) -> dict[str, int]:
        return {"window": _nbytes(self.keys) + _nbytes(self.values)} if self.is_initialized else {}

    def num_elements(self) -> int:
        return self.keys.numel() + self.values.numel() if self.is_initialized else 0


class OscarCache(Cache):
    """Mixed-precision KV cache for ``model.generate`` (see the module docstring).

    ``OscarCache(model.config, KVConfig(method="naive"))``, ``OscarCache.from_codec(codec)``
    or ``OscarCache.from_artifact(model.config, artifact_dir)``."""

    def __init__(self, config, kv: KVConfig | None = None, artifact: Artifact | None = None,
                 dequant_cache: bool = False) -> None:
        fp = ModelFingerprint.from_config(config)
        if artifact is not None:
            artifact.validate(fp)
        codec = build_codec(kv or KVConfig(), fp.num_layers, fp.num_kv_heads, fp.head_dim, artifact,
                            SlidingLayers.from_config(config))
        self._setup(codec, dequant_cache)

    def _setup(self, codec: KVCodec, dequant_cache: bool) -> None:
        self.codec, sliding = codec, codec.sliding
        dtype = torch.bfloat16 if codec.quantized else None
        layers = [WindowLayer(sliding.window, dtype) if sliding and i in sliding.layers
                  else OscarLayer(layer, codec.config, dequant_cache) for i, layer in enumerate(codec.layers)]
        super().__init__(layers=layers)

    @classmethod
    def from_codec(cls, codec: KVCodec, dequant_cache: bool = False) -> OscarCache:
        """A cache of ``codec`` (its ``sliding`` layers, if any, become :class:`WindowLayer` s)."""
        cache = cls.__new__(cls)
        cache._setup(codec, dequant_cache)
        return cache

    @classmethod
    def from_artifact(cls, config, path: str | Path, kv: KVConfig | None = None,
                      dequant_cache: bool = False) -> OscarCache:
        """OSCAR cache from a rotation artifact, validated against ``config`` (errors name the field).

        ``kv`` defaults to ``KVConfig(method="oscar")`` with the artifact's group size and its
        recipe's windows (``oscarkv.quant.artifact.apply_recipe``), if the manifest holds one."""
        art = Artifact.load(path, expect=ModelFingerprint.from_config(config))
        kv = kv or apply_recipe(KVConfig(method="oscar", group_size=art.manifest["group_size"]), art)
        if kv.method != "oscar":
            raise ValueError(f"OscarCache.from_artifact needs KVConfig.method 'oscar', got {kv.method!r}")
        return cls(config, kv, art, dequant_cache)

    def store(self, doc: Cache) -> None:
        """Write the K/V of a prefilled transformers cache (``DynamicCache``) into this one; a sliding layer
        takes the document's length with its last tokens (so its mask offsets stay right)."""
        for i, layer in enumerate(doc.layers):
            self.update(layer.keys, layer.values, i)
            if isinstance(self.layers[i], WindowLayer):
                self.layers[i].cumulative_length = layer.cumulative_length

    def tiers(self) -> Tiers:
        return next(layer for layer in self.layers if isinstance(layer, OscarLayer)).tiers()

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held per tier over all layers (history: packed codes + fp16 scale/zero)."""
        total: dict[str, int] = {}
        for layer in self.layers:
            for name, n in layer.memory_bytes().items():
                total[name] = total.get(name, 0) + n
        return total

    def bf16_equivalent_bytes(self) -> int:
        """Bytes a BF16 cache of the same tokens would hold."""
        return 2 * sum(layer.num_elements() for layer in self.layers)

    def bpe(self) -> float:
        """Bits per stored element over sink, history, recent and the sliding layers' windows (the optional
        dequant cache excluded)."""
        elements = sum(layer.num_elements() for layer in self.layers)
        stored = sum(v for k, v in self.memory_bytes().items() if k in (*TIERS, "window"))
        return 8.0 * stored / elements if elements else 0.0
