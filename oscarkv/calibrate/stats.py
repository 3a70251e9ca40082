"""Streaming attention statistics, gathered inside the forward pass with nothing dumped.

Role: the calibration attention function, registered with transformers as ``"oscarkv_calibrate"``,
computes causal GQA attention itself (fp32, via SDPA with ``is_causal``) and hands the post-RoPE
``q``, the ``k``, ``v`` and the per-head outputs ``o = S·V`` of every layer to an *observer*
passed through the model call's keyword ``oscar_stats`` (transformers forwards unknown keyword
arguments from ``model(...)`` down to the attention function; no global state is involved).

Data owned:

* :class:`StatsCollector` — float64 running sums per (layer, KV head) over all calibration
  tokens (each chunk's products in fp32, see :func:`gram`); :meth:`StatsCollector.finalize` normalizes them into :class:`Statistics`:
  ``C_Q = (1/N) Σ_t Σ_g q_gᵀq_g`` and ``C_S = (1/N) Σ_t Σ_g o_gᵀo_g`` (``g`` over the query heads
  of the KV head's group, ``N`` tokens), the proxy ``(1/N) Σ_t (k C_Q kᵀ) vᵀv``, the key and value
  means and second moments ``C_K``, ``C_V`` (for the importance scaling and reports). Summing over the group's heads (rather than
  averaging) makes ``e C_Q eᵀ`` the total squared logit error of every query head that reads the
  key, on the same footing as the value objective. With ``query_weighting="retrieval"``
  (``CalibrationConfig``), ``C_Q = (1/N) Σ_t Σ_g ŵ_gt q_gtᵀq_gt`` instead, ``ŵ = w / mean(w)``
  with ``w`` the :func:`retrieval_scores` and the mean over the ``N·G`` query rows of each
  (layer, KV head); the proxy weighs its values with that ``C_Q``, every other moment is unchanged.
* :class:`HeldoutCapture` — the fp32 ``q``, ``k``, ``v`` of the held-out tokens (about 1K
  tokens, kept in memory) on which clips are fitted.

NOTE (proxy): the proxy weight ``k C_Q kᵀ`` needs ``C_Q``, which is only known after all data.
Instead of a second pass (doubling the cost), the collector uses a running estimate: the ``C_Q``
accumulated over every chunk seen so far, *including* the current one (its queries are in hand
before its keys are weighed). After the first 1K-token chunk the estimate is already close;
the proxy is an ablation option only (``CalibrationConfig.value_objective``).

Next: :mod:`oscarkv.calibrate.solve` turns :class:`Statistics` and the held-out capture into
rotations, means and clip ratios.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import AttentionInterface

from oscarkv.config import QUERY_WEIGHTINGS, KVConfig
from oscarkv.kernels.reference import banded_attention

NAME = "oscarkv_calibrate"
"""The transformers attention implementation name used only while calibrating."""


class Observer(Protocol):
    """Receives every layer's attention tensors during a calibration forward."""

    def observe(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                out: torch.Tensor, scaling: float) -> None: ...


def causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> torch.Tensor:
    """fp32 causal GQA attention: ``query [B, Hq, T, d]``, ``key/value [B, Hkv, T, d]`` → ``[B, Hq, T, d]``."""
    return F.scaled_dot_product_attention(query.float(), key.float(), value.float(), is_causal=True,
                                          scale=scaling, enable_gqa=True)


def calibration_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                          oscar_stats: Observer | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """The registered attention function; returns ``([B, T, Hq, d], None)`` like transformers' own.

    NOTE: calibration batches are unpadded sequences starting at position 0 with no KV cache,
    so plain causal attention is exact and ``attention_mask`` (None for a custom implementation)
    is not needed. A sliding-window layer (Gemma 3) gets its band (query ``p`` reads keys
    ``(p − W, p]``) and is not observed: it keeps a BF16 window, nothing to calibrate.
    """
    if key.shape[2] != query.shape[2]:
        raise ValueError("calibration attention needs whole causal sequences (use_cache=False, no past)")
    window = getattr(module, "sliding_window", None)
    if window:
        return banded_attention(query, key, value, scaling, window).transpose(1, 2).contiguous().to(query.dtype), None
    out = causal_attention(query, key, value, scaling)  # [B, Hq, T, d] fp32
    if oscar_stats is not None:
        oscar_stats.observe(module.layer_idx, query, key, value, out, scaling)
    return out.transpose(1, 2).contiguous().to(query.dtype), None



AttentionInterface.register(NAME, calibration_attention)


@contextmanager
def calibration_mode(model: torch.nn.Module) -> Iterator[None]:
    """Route the model's attention through :func:`calibration_attention`; restore it afterwards."""
    previous = model.config._attn_implementation
    model.config._attn_implementation = NAME
    try:
        yield
    finally:
        model.config._attn_implementation = previous


@torch.inference_mode()
def run_forward(model: torch.nn.Module, batches: Sequence[torch.Tensor], observer: Observer, desc: str) -> None:
    """One independent forward per ``[B, T]`` batch (positions from 0), feeding ``observer``; the ids go to
    the device of the model's input embeddings (a model on a GPU takes the host's token ids)."""
    device = model.get_input_embeddings().weight.device
    with calibration_mode(model):
        for ids in tqdm(batches, desc=desc, unit="chunk", leave=False):
            model(ids.to(device), use_cache=False, logits_to_keep=1, oscar_stats=observer)


RETRIEVAL_SINK = KVConfig.sink
"""Keys before this position are the BF16 sink (``KVConfig`` default): a query's attention on them
is no retrieval from INT2 and does not count in its score (the first tokens draw most heads' mass)."""
RETRIEVAL_DISTANCE = KVConfig.recent
"""A key counts for a query's retrieval score only this many positions back or more (the default
BF16 recent window): the keys a served query reads from INT2."""
SCORE_ROWS = 256
"""Query rows per block when :func:`retrieval_scores` forms the attention probabilities."""


def retrieval_scores(query: torch.Tensor, key: torch.Tensor, scaling: float, sink: int = RETRIEVAL_SINK,
                     distance: int = RETRIEVAL_DISTANCE) -> torch.Tensor:
    """Each query's retrieval score, fp32 ``[B, Hq, T]`` from ``query [B, Hq, T, d]``, ``key [B, Hkv, T, d]``.

    ``w_gt = max_j p_g(t, j)`` over the keys ``sink ≤ j ≤ t − distance`` (0 when there are none),
    ``p`` the causal softmax probabilities: high only for a query that puts much of its attention on
    one far key past the sink (sharp and long-range: a retrieval head's query). Probabilities are
    formed ``SCORE_ROWS`` query rows at a time."""
    b, hq, t, d = query.shape
    hkv = key.shape[1]
    k = key.float().unsqueeze(2).transpose(-1, -2)  # [B, Hkv, 1, d, T]
    pos = torch.arange(t, device=query.device)
    out = []
    for rows in pos.split(SCORE_ROWS):
        q = query[:, :, rows].float().reshape(b, hkv, hq // hkv, len(rows), d)
        logits = (q @ k).reshape(b, hq, len(rows), t) * scaling  # [B, Hq, r, T]
        p = torch.softmax(logits.masked_fill(pos > rows[:, None], float("-inf")), dim=-1)
        far = (pos >= sink) & (pos <= rows[:, None] - distance)  # [r, T]
        out.append(p.masked_fill(~far, 0.0).amax(-1))
    return torch.cat(out, dim=-1)


def by_kv_head(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[B, H, T, d]`` → ``[Hkv, B·(H/Hkv)·T, d]``: rows of every head of each GQA group.

    Query head ``g`` belongs to KV head ``g // (H / Hkv)``, as in transformers' ``repeat_kv``."""
    b, h, t, d = x.shape
    return x.reshape(b, kv_heads, h // kv_heads, t, d).transpose(0, 1).reshape(kv_heads, -1, d)


def gram(x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """``Σ_n w_n x_nᵀ x_n`` per head for ``x [H, N, d]`` (optional ``weight [H, N]``) → float64 ``[H, d, d]``.

    NOTE: one chunk's product runs in fp32 (a few thousand rows: ~1e-6 relative error, 3x faster
    than fp64 on CPU); the running sums across chunks are float64."""
    x = x.float()
    xw = x if weight is None else x * weight.unsqueeze(-1)
    return (xw.transpose(1, 2) @ x).double()


@dataclass(frozen=True)
class Statistics:
    """Normalized second moments per (layer, KV head), float64 (see the module docstring)."""

    c_q: torch.Tensor  # [L, H, d, d] query second moment, summed over the group's query heads
    c_s: torch.Tensor  # [L, H, d, d] attention-output second moment (exact value objective)
    c_proxy: torch.Tensor  # [L, H, d, d] reference proxy Σ (k C_Q kᵀ) vᵀv / N
    c_k: torch.Tensor  # [L, H, d, d] key second moment (importance scaling, reporting)
    c_v: torch.Tensor  # [L, H, d, d] value second moment (importance scaling)
    key_mean: torch.Tensor  # [L, H, d]
    value_mean: torch.Tensor  # [L, H, d]
    tokens: int


@dataclass
class _LayerSums:
    """float64 running sums of one layer (``H`` KV heads)."""

    qq: torch.Tensor
    oo: torch.Tensor
    kk: torch.Tensor
    vv: torch.Tensor
    wvv: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    w: torch.Tensor  # [H] Σ of the query weights (retrieval weighting; zero when uniform)
    n: int = 0
    rows: int = 0  # query rows seen per KV head: n · G

    @classmethod
    def zeros(cls, heads: int, d: int) -> _LayerSums:
        z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        return cls(z(heads, d, d), z(heads, d, d), z(heads, d, d), z(heads, d, d), z(heads, d, d), z(heads, d), z(heads, d),
                   z(heads))

    def c_q(self, weighted: bool) -> torch.Tensor:
        """``C_Q`` from the sums so far, ``[H, d, d]``: ``qq / n``, or with weights ``qq / (n · mean w)``."""
        if not weighted:
            return self.qq / self.n
        if not bool((self.w > 0).all()):
            raise ValueError("retrieval query weighting: no query of some head put weight on a key past the sink "
                             "and the recent window; calibration chunks must be longer than the sink + distance of "
                             f"retrieval_scores ({RETRIEVAL_SINK} + {RETRIEVAL_DISTANCE} tokens by default)")
        return self.qq / (self.n * (self.w / self.rows)).view(-1, 1, 1)


class StatsCollector:
    """Accumulates :class:`Statistics` over calibration chunks; one per calibration run."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, skip: frozenset[int] = frozenset(),
                 query_weighting: str = "uniform", sink: int = RETRIEVAL_SINK, distance: int = RETRIEVAL_DISTANCE):
        if query_weighting not in QUERY_WEIGHTINGS:
            raise ValueError(f"query_weighting must be one of {QUERY_WEIGHTINGS}, got {query_weighting!r}")
        self.layers = [_LayerSums.zeros(num_kv_heads, head_dim) for _ in range(num_layers)]
        self.skip = skip  # layers never observed (sliding-window layers): their sums stay zero
        self.weighted = query_weighting == "retrieval"
        self.sink, self.distance = sink, distance  # of retrieval_scores

    def observe(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                out: torch.Tensor, scaling: float) -> None:
        heads = key.shape[1]
        s = self.layers[layer]
        k, v = by_kv_head(key.float(), heads), by_kv_head(value.float(), heads)  # [H, N, d]
        q = by_kv_head(query.float(), heads)  # [H, N·G, d]
        if self.weighted:
            w = by_kv_head(retrieval_scores(query, key, scaling, self.sink, self.distance).unsqueeze(-1), heads)[..., 0]
            s.qq += gram(q, w).cpu()  # NOTE: products on the tensors' device, sums on the host
            s.w += w.double().sum(1).cpu()
        else:
            s.qq += gram(q).cpu()
        s.oo += gram(by_kv_head(out, heads)).cpu()
        s.kk += gram(k).cpu()
        s.vv += gram(v).cpu()
        s.k += k.sum(1).double().cpu()
        s.v += v.sum(1).double().cpu()
        s.n += k.shape[1]
        s.rows += q.shape[1]
        c_q = s.c_q(self.weighted).float().to(k.device)  # running estimate, this chunk included (module docstring)
        w = ((k @ c_q) * k).sum(-1)  # [H, N] k C_Q kᵀ
        s.wvv += gram(v, w).cpu()

    def finalize(self) -> Statistics:
        """Divide the sums by the token count and stack over layers (skipped layers: zeros)."""
        seen = [s.n for i, s in enumerate(self.layers) if i not in self.skip]
        n = seen[0] if seen else 0
        if n == 0 or any(m != n for m in seen):
            raise ValueError(f"calibration statistics saw {[s.n for s in self.layers]} tokens per layer")
        stack = lambda name: torch.stack([getattr(s, name) for s in self.layers]) / n  # noqa: E731
        c_q = torch.stack([s.qq if i in self.skip else s.c_q(self.weighted) for i, s in enumerate(self.layers)])
        return Statistics(c_q, stack("oo"), stack("wvv"), stack("kk"), stack("vv"), stack("k"), stack("v"), n)


@dataclass(frozen=True)
class HeldoutLayer:
    """One layer's held-out attention inputs, fp32."""

    query: torch.Tensor  # [B, Hq, T, d] post-RoPE
    key: torch.Tensor  # [B, Hkv, T, d] post-RoPE
    value: torch.Tensor  # [B, Hkv, T, d]
    scaling: float


@dataclass
class HeldoutCapture:
    """Keeps every layer's held-out ``q``, ``k``, ``v`` (one forward over ~1K tokens)."""

    layers: dict[int, HeldoutLayer] = field(default_factory=dict)

    def observe(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                out: torch.Tensor, scaling: float) -> None:
        if layer in self.layers:
            raise ValueError(f"held-out capture saw layer {layer} twice: run a single forward")
        host = lambda x: x.float().cpu().clone()  # noqa: E731  (on the host, where the solve runs)
        self.layers[layer] = HeldoutLayer(host(query), host(key), host(value), scaling)

    def layer(self, index: int) -> HeldoutLayer:
        return self.layers[index]
