"""Solve rotations, means and clip ratios from calibration statistics (DESIGN.md §1).

Role: from :class:`~oscarkv.calibrate.stats.Statistics`, the held-out capture and a
:class:`~oscarkv.config.CalibrationConfig`, build every tensor of the rotation artifact and one
clip ratio per layer and kind, plus a per-layer summary row.

* Weighting matrix ``C``: ``C_Q`` for keys; ``C_S`` (or the proxy) for values; per (layer, KV
  head), or averaged over the layer's KV heads with ``share_heads`` (means stay per head).
  ``eig_desc(C)`` gives ``U`` and the eigenvalues, ``compose(U, cfg.rotation)`` gives ``R``.
* Importance scaling (``cfg.scaling``, an extension): per (layer, head, kind) a positive ``a``
  over the eigen-channels, ``a_i = (λ_i / v_i)^(1/4)`` (:func:`importance_scale`); the codec
  then stores ``x U diag(a) Uᵀ R`` (``oscarkv.quant.artifact.scaled_transform``).
* Clips are fitted per layer, keys and values separately, on held-out tokens disjoint from the
  statistics, through the real codec path (``TensorCodec(2, G, R, mean, c).fake``). Keys:
  ``mean_t Σ_h e C_Q eᵀ`` (``e = k̂ − k``, original domain, the per-head ``C_Q`` even when
  rotations are shared). Values: ``mean_q Σ_g ‖S_g (V̂ − V)‖²`` with the real causal scores of
  the held-out queries; ``S`` is evaluated on ``VALUE_QUERY_ROWS`` evenly spaced query rows per
  window (an estimate of the mean over all queries at a quarter of the cost for 1K-token
  windows; every key still contributes). The argmin over ``cfg.clip_grid`` wins; ties go to
  the larger ratio.
* Level tables: per layer and kind, the Lloyd-Max 2-bit table of the fitted codec (its chosen clip) on the
  same held-out tokens (:mod:`oscarkv.calibrate.levels`), stored as ``{kind}.levels``; served only where
  ``KVConfig.levels`` asks for them.
* Summary: eigen-spectrum concentration (fraction of the trace in the top ``d/8`` eigenvalues)
  and the ratio of the same weighted error for the OSCAR codec vs a Hadamard-only INT2 codec
  (no centering, no clipping): below 1 means OSCAR is predicted to do better.

Next: :mod:`oscarkv.calibrate.run` wraps the :class:`Solution` into an
:class:`~oscarkv.quant.artifact.Artifact`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from oscarkv.calibrate.levels import fit_levels, level_tensors
from oscarkv.calibrate.stats import HeldoutCapture, HeldoutLayer, Statistics
from oscarkv.config import CalibrationConfig
from oscarkv.quant.artifact import tensor_codec
from oscarkv.quant.codec import TensorCodec
from oscarkv.quant.rotation import compose, eig_desc

KINDS = ("key", "value")
FIXED_CLIPS = {"key": 0.96, "value": 0.92}
"""The reference's clip ratios, used for every layer with ``clip="fixed"``."""
VALUE_QUERY_ROWS = 256
"""Query rows per held-out window on which the value objective evaluates the scores ``S``."""

Objective = Callable[[torch.Tensor], torch.Tensor]
"""Maps stacked errors ``[n, B·T, H, d]`` (original domain, tokens batch-major) to ``n`` weighted errors."""


@dataclass(frozen=True)
class Solution:
    """Everything the artifact needs: tensors in the artifact layout, clips, summary rows."""

    tensors: dict[str, torch.Tensor]  # "{key,value}.{rotation,eigvecs,eigenvalues,mean,levels}", fp32
    clips: dict[str, list[float]]  # kind -> per-layer ratio (1.0 = no clipping)
    rows: list[dict]  # one summary row per layer


def solve(stats: Statistics, heldout: HeldoutCapture, cfg: CalibrationConfig, group: int,
          skip: frozenset[int] = frozenset()) -> Solution:
    """Rotations from the statistics, then clips and the summary layer by layer. ``skip``: layers that store
    no INT2 (sliding-window layers, never observed): the identity, unclipped, and no summary row."""
    tensors = identity_layers(solve_rotations(stats, cfg), skip)
    layers = [i for i in range(stats.c_q.shape[0]) if i not in skip]
    rows = [fit_layer(i, tensors, stats, heldout.layer(i), cfg, group) for i in layers]
    fitted = {kind: {row["layer"]: row[f"{kind}_clip"] for row in rows} for kind in KINDS}
    clips = {kind: [fitted[kind].get(i, 1.0) for i in range(stats.c_q.shape[0])] for kind in KINDS}
    tables = {kind: {row["layer"]: tuple(row[f"{kind}_levels"]) for row in rows} for kind in KINDS}
    return Solution(tensors | level_tensors(tables, stats.c_q.shape[0]), clips, rows)


def identity_layers(tensors: dict[str, torch.Tensor], layers: frozenset[int]) -> dict[str, torch.Tensor]:
    """``tensors`` with ``layers`` set to the identity: rotation and eigenvectors ``I``, eigenvalues and
    means 0, scales 1 (what ``oscarkv.quant.reference`` writes for layers its files omit)."""
    for i in layers:
        for kind in KINDS:
            d = tensors[f"{kind}.rotation"].shape[-1]
            for name in ("rotation", "eigvecs"):
                tensors[f"{kind}.{name}"][i] = torch.eye(d)
            for name, value in (("eigenvalues", 0.0), ("mean", 0.0), ("scale", 1.0)):
                if f"{kind}.{name}" in tensors:
                    tensors[f"{kind}.{name}"][i] = value
    return tensors


def weighting_matrices(stats: Statistics, cfg: CalibrationConfig) -> dict[str, torch.Tensor]:
    """``C`` per kind, ``[L, H, d, d]`` float64 (``[L, 1, d, d]`` when shared over heads)."""
    mats = {"key": stats.c_q, "value": stats.c_s if cfg.value_objective == "exact" else stats.c_proxy}
    if cfg.share_heads:
        mats = {kind: c.mean(1, keepdim=True) for kind, c in mats.items()}
    return mats


def solve_rotations(stats: Statistics, cfg: CalibrationConfig) -> dict[str, torch.Tensor]:
    """The artifact tensors ``{kind}.rotation/eigvecs/eigenvalues/mean`` (fp32, ``[L, H, ...]``)."""
    heads = stats.c_q.shape[1]
    means = {"key": stats.key_mean, "value": stats.value_mean}
    out = {}
    for kind, c in weighting_matrices(stats, cfg).items():
        evals, u = eig_desc(c)  # shared heads: solved once, then broadcast so heads are identical
        rotation = compose(u, cfg.rotation)
        out[f"{kind}.rotation"] = rotation.expand(-1, heads, -1, -1).contiguous()
        out[f"{kind}.eigvecs"] = u.float().expand(-1, heads, -1, -1).contiguous()
        out[f"{kind}.eigenvalues"] = evals.float().expand(-1, heads, -1).contiguous()
        mean = means[kind].float()
        out[f"{kind}.mean"] = mean if cfg.centers(kind) else torch.zeros_like(mean)
        if cfg.scaling:
            spread = stored_spread(stats, kind, cfg.centers(kind))  # [L, H, d, d]
            # NOTE: a value error e_t of token t reaches head g's output as Σ_t S_gt e_t; with errors
            # independent across tokens its expected square is Σ_t S_gt² ‖e_t‖², the same weight for
            # every channel. So values are scaled for an isotropic weighting (λ = 1), keys by C_Q.
            lam = evals if kind == "key" else torch.ones_like(evals)
            out[f"{kind}.scale"] = importance_scale(lam.expand(-1, heads, -1), u.expand(-1, heads, -1, -1), spread)
    return out


SCALE_FLOOR = 1e-4
"""Eigenvalues and variances below this fraction of their head's largest are raised to it, which
bounds the scaling's dynamic range to 10x per factor."""


def stored_spread(stats: Statistics, kind: str, center: bool) -> torch.Tensor:
    """Second moment of what the codec quantizes: ``C - μᵀμ`` when centered, else ``C``; ``[L, H, d, d]``."""
    c, mu = (stats.c_k, stats.key_mean) if kind == "key" else (stats.c_v, stats.value_mean)
    return c - mu.unsqueeze(-1) * mu.unsqueeze(-2) if center else c


def importance_scale(evals: torch.Tensor, u: torch.Tensor, spread: torch.Tensor) -> torch.Tensor:
    """``a_i = (λ_i / v_i)^(1/4)`` with ``v_i = u_iᵀ Σ u_i``, normalized to mean square 1; fp32 ``[L, H, d]``.

    NOTE: for a uniform quantizer whose step follows the norm of the Hadamard-mixed vector,
    the weighted error is ``∝ (Σ a_i² v_i)(Σ λ_i / a_i²)``, minimized (Cauchy-Schwarz) at
    ``a_i² ∝ sqrt(λ_i / v_i)``."""
    lam = evals.double()
    var = ((spread.double() @ u.double()) * u.double()).sum(-2)  # [L, H, d]: u_iᵀ Σ u_i
    floor = lambda x: x.clamp_min(SCALE_FLOOR * x.amax(-1, keepdim=True).clamp_min(1e-30))  # noqa: E731
    a = (floor(lam) / floor(var)) ** 0.25
    return (a / a.square().mean(-1, keepdim=True).sqrt()).float()


def concentration(evals: torch.Tensor) -> float:
    """Fraction of the trace in the top ``d/8`` eigenvalues of ``evals [H, d]`` (descending), mean over heads."""
    top = max(1, evals.shape[-1] // 8)
    return float((evals[..., :top].sum(-1) / evals.sum(-1)).mean())


def candidate_clips(cfg: CalibrationConfig, kind: str) -> list[float]:
    """Clip ratios to evaluate, largest first (so ties resolve to the larger ratio)."""
    mode = cfg.clip_mode(kind)
    if mode == "fitted":
        return sorted(set(cfg.clip_grid), reverse=True)
    return [FIXED_CLIPS[kind] if mode == "fixed" else 1.0]


def fit_layer(layer: int, tensors: dict[str, torch.Tensor], stats: Statistics, held: HeldoutLayer,
              cfg: CalibrationConfig, group: int) -> dict:
    """Fit both clips of one layer and return its summary row.

    Row fields, per kind ``key``/``value``: ``{kind}_concentration``, ``{kind}_clip``,
    ``{kind}_error`` (fitted OSCAR codec), ``{kind}_error_hadamard``, ``{kind}_error_ratio``, ``{kind}_levels``
    (the Lloyd-Max table of the fitted codec); plus
    ``keycov_concentration`` (of ``C_K``, for comparison with the query-weighted spectrum)."""
    objectives = {"key": key_objective(stats.c_q[layer]), "value": value_objective(held)}
    data = {"key": held.key, "value": held.value}
    row: dict = {"layer": layer}
    for kind in KINDS:
        codec = tensor_codec(tensors, kind, layer, group)  # unclipped, as the artifact builds it
        clips = candidate_clips(cfg, kind)
        x = tokens_first(data[kind])
        fakes = [hadamard_codec(codec.rotation.shape[0], codec.rotation.shape[-1], group).fake(x)]
        fakes += round_trips(codec, clips, x)
        errors = objectives[kind](torch.stack([f - x for f in fakes])).tolist()
        best = min(range(len(clips)), key=lambda i: (errors[1 + i], -clips[i]))
        row[f"{kind}_concentration"] = concentration(tensors[f"{kind}.eigenvalues"][layer])
        row.update(_error_fields(kind, clips[best], errors[1 + best], errors[0]))
        row[f"{kind}_levels"] = list(fit_levels(replace(codec, clip=clips[best]), x))
    row["keycov_concentration"] = concentration(eig_desc(stats.c_k[layer])[0])
    return row


def _error_fields(kind: str, clip: float, error: float, hadamard: float) -> dict:
    ratio = error / hadamard if hadamard > 0 else float("nan")
    return {f"{kind}_clip": clip, f"{kind}_error": error, f"{kind}_error_hadamard": hadamard,
            f"{kind}_error_ratio": ratio}


def hadamard_codec(heads: int, d: int, group: int) -> TensorCodec:
    """The Hadamard-only INT2 baseline: no centering, no clipping."""
    return TensorCodec(2, group, compose(torch.eye(d).expand(heads, d, d), "h"))


def round_trips(codec: TensorCodec, clips: list[float], x: torch.Tensor) -> list[torch.Tensor]:
    """``replace(codec, clip=c).fake(x)`` for every ratio ``c``, rotating ``x [N, H, d]`` only once.

    NOTE: the same calls as :meth:`TensorCodec.fake` (encode → decode → from_rotated), so the
    fit sees exactly the numbers the caches will store."""
    x_rot = codec.to_rotated(x)
    out = []
    for c in clips:
        clipped = replace(codec, clip=c)
        out.append(clipped.from_rotated(clipped.decode(clipped.encode(x_rot))))
    return out


def tokens_first(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, d]`` → ``[B·T, H, d]``, the layout the codecs take."""
    return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[-1])


def key_objective(c_q: torch.Tensor) -> Objective:
    """``mean_t Σ_h e_h C_Q,h e_hᵀ``: squared logit error summed over the query heads."""
    cq = c_q.float()  # [H, d, d]

    def error(e: torch.Tensor) -> torch.Tensor:
        per_head = e.transpose(1, 2)  # [n, H, B·T, d]
        return ((per_head @ cq) * per_head).double().sum((1, 2, 3)) / e.shape[1]

    return error


def value_objective(held: HeldoutLayer) -> Objective:
    """``mean_q Σ_g ‖S_g E_h(g)‖²`` over the sampled query rows (module docstring)."""
    scores = sampled_scores(held)  # [B, Hkv, rep·R, T]
    rows = scores.shape[2] // (held.query.shape[1] // held.key.shape[1])

    def error(e: torch.Tensor) -> torch.Tensor:
        n, _, h, d = e.shape
        b, t = held.key.shape[0], held.key.shape[2]
        stacked = e.reshape(n, b, t, h, d).permute(1, 3, 2, 0, 4).reshape(b, h, t, n * d)  # one matmul for all
        out = (scores @ stacked).reshape(b, h, -1, n, d)  # [B, Hkv, rep·R, n, d]
        return out.double().square().sum((0, 1, 2, 4)) / (b * rows)

    return error


def sampled_scores(held: HeldoutLayer) -> torch.Tensor:
    """Causal softmax scores of ``VALUE_QUERY_ROWS`` evenly spaced queries, ``[B, Hkv, rep·R, T]``."""
    q, k = held.query, held.key
    b, hkv, t, d = k.shape
    rows = torch.linspace(0, t - 1, min(t, VALUE_QUERY_ROWS)).round().long().unique()  # [R]
    q_rows = by_group(q[:, :, rows], hkv)  # [B, Hkv, rep·R, d]
    logits = (q_rows @ k.transpose(-1, -2)) * held.scaling  # [B, Hkv, rep·R, T]
    visible = torch.arange(t)[None, :] <= rows.repeat(q.shape[1] // hkv)[:, None]  # [rep·R, T]
    return torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)


def by_group(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[B, Hq, R, d]`` → ``[B, Hkv, rep·R, d]``: the query rows of each GQA group together."""
    b, hq, r, d = x.shape
    return x.reshape(b, kv_heads, hq // kv_heads * r, d)
