"""The calibration driver behind ``oscarkv calibrate``: text → statistics → solve → artifact.

Role: tokenize the calibration text once; stream the first ``cfg.tokens`` tokens through the
model as independent forwards of ``cfg.chunk`` tokens (positions from 0) while
:class:`~oscarkv.calibrate.stats.StatsCollector` accumulates second moments; run the next
``cfg.heldout_tokens`` tokens (disjoint from the statistics) as one more forward, batched into
windows of ``min(chunk, heldout_tokens)`` tokens, to capture the held-out ``q, k, v`` that
clips are fitted on; solve (:mod:`oscarkv.calibrate.solve`; sliding-window layers, which keep
a BF16 window, are neither observed nor solved: the identity); and wrap the result in an
:class:`~oscarkv.quant.artifact.Artifact` with the manifest that module defines.

:func:`fit_missing_levels` adds the Lloyd-Max level tables to an artifact fitted before them (one
forward over the same held-out tokens, its own rotations and clips; ``calibrate --rotations DIR --levels``).

Owns nothing persistent: the artifact goes back to the caller (the CLI saves it), the
per-layer summary rows go to :func:`format_summary` and into the manifest.
"""

from __future__ import annotations

import time
import torch

from oscarkv.calibrate.levels import fit_levels, level_tensors
from oscarkv.calibrate.solve import KINDS, Solution, solve, tokens_first
from oscarkv.calibrate.stats import HeldoutCapture, StatsCollector, run_forward
from oscarkv.calibrate.stream import check_streamable, stream_forward
from oscarkv.config import CalibrationConfig
from oscarkv.models.loader import LoadedModel, bf16_layers, is_default_model
from oscarkv.quant.artifact import Artifact, ModelFingerprint, new_manifest
from oscarkv.quant.codec import default_group

DEFAULT_TEXT = "calibration.txt"
"""The bundled calibration text (``oscarkv.data``) used when no texts are given."""


def calibrate(loaded: LoadedModel, cfg: CalibrationConfig, texts: list[str] | None = None,
              data_desc: str | None = None) -> tuple[Artifact, list[dict]]:
    """Fit OSCAR rotations, means and clips for ``loaded``; return the artifact and summary rows.

    ``texts`` default to the bundled calibration text; they are joined with blank lines and
    tokenized once. ``data_desc`` names the data in the manifest. Raises ``ValueError`` when
    the text is shorter than ``cfg.tokens + cfg.heldout_tokens`` tokens.
    """
    return calibrate_variants(loaded, {"": cfg}, texts, data_desc)[""]


ABLATIONS = {
    "u_only": {"rotation": "u"}, "h_only": {"rotation": "h"}, "clip_fixed": {"clip": "fixed"},
    "clip_none": {"clip": "none"}, "proxy_values": {"value_objective": "proxy"}, "no_center": {"center": "none"},
    "no_scaling": {"scaling": False}, "shared_heads": {"share_heads": True},
    "center_both": {"center": "both"}, "key_clip_fixed": {"clip": "fixed/fitted"},
    "value_clip_fixed": {"clip": "fitted/fixed"}, "key_clip_none": {"clip": "none/fitted"},
}
"""The ablations of ``oscarkv calibrate --ablations``: each changes one solve-time option of the recipe."""


def calibrate_variants(loaded: LoadedModel, cfgs: dict[str, CalibrationConfig], texts: list[str] | None = None,
                       data_desc: str | None = None) -> dict[str, tuple[Artifact, list[dict]]]:
    """:func:`calibrate` for several configs from one pass of statistics (the forward dominates).

    The configs may differ only in solve-time options (rotation, objectives, centering, scaling,
    clipping, head sharing); the data options (tokens, held-out tokens, chunk, seed, group size,
    query weighting) must agree, since the statistics are shared."""
    start = time.perf_counter()
    first = next(iter(cfgs.values()))
    data_fields = ("tokens", "heldout_tokens", "chunk", "seed", "group_size", "stream_layers", "query_weighting")
    for name, cfg in cfgs.items():
        bad = [f for f in data_fields if getattr(cfg, f) != getattr(first, f)]
        if bad:
            raise ValueError(f"calibration variant {name!r} differs in data options {bad}; they must be shared")
    fp = ModelFingerprint.from_config(loaded.config)
    group = default_group(fp.head_dim, first.group_size)
    if texts is None:
        texts, data_desc = [_default_text()], data_desc or f"oscarkv.data:{DEFAULT_TEXT}"
    chunks, heldout = split_tokens(token_ids(loaded.tokenizer, texts), first)
    skip = bf16_layers(loaded.config)  # sliding-window layers: a BF16 window, nothing to calibrate
    collector = StatsCollector(fp.num_layers, fp.num_kv_heads, fp.head_dim, skip, first.query_weighting)
    if first.stream_layers:
        check_streamable(loaded.config)
    forward = stream_forward if first.stream_layers else run_forward
    forward(loaded.model, chunks, collector, "calibration statistics")
    capture = HeldoutCapture()
    forward(loaded.model, [heldout], capture, "held-out tokens")
    stats = collector.finalize()
    out = {}
    for name, cfg in cfgs.items():
        solution = solve(stats, capture, cfg, group, skip)
        calibration = {"source": data_desc or f"{len(texts)} caller-supplied text(s)", "model_source": model_source(loaded),
                       "tokens": cfg.tokens, "heldout_tokens": heldout.numel(),
                       "seconds": round(time.perf_counter() - start, 2)}
        out[name] = Artifact(build_manifest(fp, cfg, group, solution, calibration), solution.tensors), solution.rows
    return out


def fit_missing_levels(loaded: LoadedModel, artifact: Artifact, texts: list[str] | None = None) -> bool:
    """Add ``key.levels``/``value.levels`` to ``artifact`` (in place) when it holds none: the held-out tokens of
    its manifest's options (``texts`` default to the bundled calibration text), through each layer's codec with
    its fitted clip. Returns whether it fitted them."""
    if all(f"{kind}.levels" in artifact.tensors for kind in KINDS):
        return False
    opts = artifact.manifest["options"]
    cfg = CalibrationConfig(tokens=opts["tokens"], heldout_tokens=opts["heldout_tokens"], chunk=opts["chunk"])
    _, heldout = split_tokens(token_ids(loaded.tokenizer, texts or [_default_text()]), cfg)
    capture = HeldoutCapture()
    run_forward(loaded.model, [heldout], capture, "held-out tokens (level tables)")
    skip = set(artifact.manifest.get("bf16_layers", []))
    group, layers = artifact.manifest["group_size"], artifact.fingerprint.num_layers
    tables = {kind: {} for kind in KINDS}
    for i in (i for i in range(layers) if i not in skip):
        held = capture.layer(i)
        for kind in KINDS:
            codec = artifact.fitted_codec(kind, i, group)
            tables[kind][i] = fit_levels(codec, tokens_first(held.key if kind == "key" else held.value))
    artifact.tensors.update(level_tensors(tables, layers))
    for row in artifact.manifest.get("summary") or []:  # as calibrate's solve records them
        row.update({f"{kind}_levels": list(tables[kind][row["layer"]]) for kind in KINDS if row["layer"] in tables[kind]})
    artifact.validate()
    return True


def model_source(loaded: LoadedModel) -> str:
    """The model as the manifest records it: ``default`` for the embedded model (the shipped artifact
    then names no machine's install path), else the resolved path."""
    return "default" if is_default_model(loaded) else loaded.source


def _default_text() -> str:
    from oscarkv.data import read_text

    return read_text(DEFAULT_TEXT)


def token_ids(tokenizer, texts: list[str]) -> torch.Tensor:
    """All texts joined by blank lines, tokenized once without special tokens: ``int64 [n]``."""
    ids = tokenizer("\n\n".join(texts), add_special_tokens=False, verbose=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def split_tokens(ids: torch.Tensor, cfg: CalibrationConfig) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Statistics chunks ``[1, chunk]`` (the last may be shorter) and the held-out batch ``[n, w]``.

    The held-out tokens directly follow the statistics tokens; they form ``n`` windows of
    ``w = min(chunk, heldout_tokens)`` tokens, a trailing partial window is dropped."""
    need = cfg.tokens + cfg.heldout_tokens
    if cfg.heldout_tokens < 16:
        raise ValueError(f"CalibrationConfig.heldout_tokens must be >= 16 to fit clips, got {cfg.heldout_tokens}")
    if ids.numel() < need:
        raise ValueError(f"calibration text too short: {ids.numel()} tokens, but tokens + heldout_tokens = "
                         f"{cfg.tokens} + {cfg.heldout_tokens} = {need} are needed; give more text or fewer tokens")
    chunks = [c[None] for c in ids[:cfg.tokens].split(cfg.chunk)]
    width = min(cfg.chunk, cfg.heldout_tokens)
    held = ids[cfg.tokens:need]
    return chunks, held[:held.numel() // width * width].view(-1, width)


def build_manifest(fp: ModelFingerprint, cfg: CalibrationConfig, group: int, solution: Solution,
                   calibration: dict) -> dict:
    """The artifact manifest (field meanings in :mod:`oscarkv.quant.artifact`); ``bf16_layers`` lists the layers
    not calibrated (sliding-window layers: identity), when there are any."""
    skipped = sorted(set(range(fp.num_layers)) - {row["layer"] for row in solution.rows})
    return new_manifest(fp, cfg.options(), group, solution.clips, calibration, summary=solution.rows,
                        **({"bf16_layers": skipped} if skipped else {}))


_COLUMNS = (("layer", "layer", "{:>5d}"), ("K conc", "key_concentration", "{:>7.3f}"),
            ("V conc", "value_concentration", "{:>7.3f}"), ("K clip", "key_clip", "{:>7.2f}"),
            ("V clip", "value_clip", "{:>7.2f}"), ("K/had", "key_error_ratio", "{:>7.3f}"),
            ("V/had", "value_error_ratio", "{:>7.3f}"))


def format_summary(rows: list[dict]) -> str:
    """Fixed-width per-layer table with a final line of means over layers."""
    legend = ("conc: share of the weighting trace in the top d/8 eigenvalues; "
              "K/had, V/had: predicted weighted INT2 error vs Hadamard-only (lower is better)")
    header = " ".join(f"{name:>{5 if key == 'layer' else 7}}" for name, key, _ in _COLUMNS)
    lines = [legend, header]
    lines += [" ".join(fmt.format(row[key]) for _, key, fmt in _COLUMNS) for row in rows]
    means = [sum(row[key] for row in rows) / max(1, len(rows)) for _, key, _ in _COLUMNS[1:]]
    lines.append(" mean " + " ".join(fmt.format(m) for m, (_, _, fmt) in zip(means, _COLUMNS[1:])))
    return "\n".join(lines)
