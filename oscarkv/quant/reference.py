"""The OSCAR reference's published rotation files, read into our artifact and written from it.

Role: ``oscarkv import-rotations`` and ``oscarkv export-rotations``. The reference publishes, per
model, a key file ``k_rotation_*.pt`` and a value file ``v_rotation_*.pt``: ``torch.save``
archives (read here with ``weights_only=True`` only, never plain pickle) holding

    {format_version, objective, source_grouping,
     layers: {layer_id: {layer_id, rotation, eigenvalues}}}

``rotation`` is fp32 ``[d, d]`` (one per layer, shared by its KV heads) or ``[H_kv, d, d]``
(``format_version`` 2, per KV head); rows are vectors, ``x_rot = x @ R`` — our convention
(``oscarkv.quant.rotation``), applied to q and k after RoPE and QK-norm, and to v.
``eigenvalues`` are ascending (ours descending) and may be absent. Quirks of real files, all
accepted: ``format_version`` may be a string (``"identity-v1"``); layer ids may be sparse
(hybrid models: only the layers that need one) and int or str; a Hadamard file shares one
storage across all layers (copied apart here); the archive's inner folder is the file's
original name, not its current one (recorded as ``archive_name``); some matrices have
determinant −1 (a reflection: orthogonal, accepted).

The files carry no clips, group size, windows or model identity: those come from a
:class:`~oscarkv.config.ReferenceRecipe` (the reference's published defaults, overrides
recorded as such) and the model's fingerprint. Refusals (:class:`ReferenceFormatError`) name the
field: a missing layer, a shape the model does not have, a non-orthogonal matrix (max
``|R Rᵀ − I|`` > 1e-4, the artifact's own tolerance), NaN, or a folder holding several
candidate files of one kind.

The artifact made from them (:mod:`oscarkv.quant.artifact`) has zero means (the reference does
not center), no importance scaling, ``eigvecs`` equal to the rotation (the files do not hold the
eigenbasis; ``eigvecs`` is read only with a scale), zero ``eigenvalues`` where the file has none,
and the recipe's clips for every layer. Layers the file has no entry for and that never store
INT2 (``bf16_layers``: sliding-window layers) get the identity (the manifest lists the layers each
file held).
Its ``imported`` manifest field keeps each file's top-level fields, so export writes them back.
"""

from __future__ import annotations

import zipfile
from dataclasses import asdict, fields
from pathlib import Path

import torch

from oscarkv.config import ReferenceRecipe
from oscarkv.quant.artifact import ORTHO_TOL, Artifact, ModelFingerprint, new_manifest
from oscarkv.quant.codec import default_group
from oscarkv.quant.rotation import orthogonality_error

KINDS = {"key": "k", "value": "v"}
"""Our tensor kinds and the reference's file prefixes (``k_rotation_*.pt``, ``v_rotation_*.pt``)."""


class ReferenceFormatError(ValueError):
    """A reference rotation file that is missing, malformed or made for another model."""


def find_files(folder: Path) -> dict[str, Path]:
    """``{kind: file}``: exactly one ``{k,v}_rotation_*.pt`` of each kind in ``folder``."""
    out = {}
    for kind, prefix in KINDS.items():
        found = sorted(folder.glob(f"{prefix}_rotation_*.pt"))
        if not found:
            raise ReferenceFormatError(f"{folder}: no {prefix}_rotation_*.pt ({kind} rotation file)")
        if len(found) > 1:
            raise ReferenceFormatError(f"{folder}: several candidate {kind} files ({', '.join(p.name for p in found)}); "
                                       "keep one per folder")
        out[kind] = found[0]
    return out


def read_file(path: Path) -> dict:
    """The archive's object (``weights_only=True``) with its inner folder name under ``_archive``."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
        with zipfile.ZipFile(path) as z:
            archive = z.namelist()[0].split("/")[0]
    except (OSError, RuntimeError, zipfile.BadZipFile) as e:
        raise ReferenceFormatError(f"{path}: not a torch.save archive readable with weights_only=True ({e})") from e
    if not isinstance(obj, dict) or not isinstance(obj.get("layers"), dict):
        raise ReferenceFormatError(f"{path}: field layers: expected a dict of layer entries, "
                                   f"got {type(obj.get('layers') if isinstance(obj, dict) else obj).__name__}")
    return {**obj, "_archive": archive}


def layer_entries(obj: dict, where: str) -> dict[int, dict]:
    """``{layer id: entry}`` with int ids (the files use int or str keys); an inner ``layer_id`` must agree."""
    out = {}
    for key, entry in obj["layers"].items():
        try:
            lid = int(key)
        except (TypeError, ValueError):
            raise ReferenceFormatError(f"{where}: field layers: key {key!r} is not a layer id") from None
        if lid in out:
            raise ReferenceFormatError(f"{where}: field layers: layer {lid} appears twice ({key!r})")
        if not isinstance(entry, dict) or "rotation" not in entry:
            raise ReferenceFormatError(f"{where}: field layers[{key!r}].rotation: missing")
        inner = entry.get("layer_id", lid)
        if str(inner) != str(lid):
            raise ReferenceFormatError(f"{where}: field layers[{key!r}].layer_id: {inner!r} disagrees with its key")
        out[lid] = entry
    return out


def _rotation(t, heads: int, d: int, where: str) -> torch.Tensor:
    """``[H, d, d]`` fp32, its own storage (a Hadamard file shares one across layers), validated."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise ReferenceFormatError(f"{where}: expected a float tensor, got {type(t).__name__}")
    if tuple(t.shape) == (d, d):
        t = t.expand(heads, d, d)
    if tuple(t.shape) != (heads, d, d):
        raise ReferenceFormatError(f"{where}: shape {tuple(t.shape)}, but the model needs [{d}, {d}] or "
                                   f"[{heads}, {d}, {d}] (num_kv_heads {heads}, head_dim {d})")
    t = t.float().clone().contiguous()
    if not torch.isfinite(t).all():
        raise ReferenceFormatError(f"{where}: contains NaN or Inf")
    err = orthogonality_error(t)
    if err > ORTHO_TOL:
        raise ReferenceFormatError(f"{where}: not orthogonal (max |R Rᵀ - I| = {err:.2e} > {ORTHO_TOL:g})")
    return t


def _eigenvalues(t, heads: int, d: int, where: str) -> torch.Tensor:
    """Ascending ``[d]`` or ``[H, d]`` → descending ``[H, d]`` fp32."""
    if not isinstance(t, torch.Tensor) or t.shape[-1:] != (d,) or t.dim() > 2 or (t.dim() == 2 and t.shape[0] != heads):
        raise ReferenceFormatError(f"{where}: expected [{d}] or [{heads}, {d}], got "
                                   f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    t = t.float().expand(heads, d)
    if not torch.isfinite(t).all():
        raise ReferenceFormatError(f"{where}: contains NaN or Inf")
    if (t.diff(dim=-1) < -1e-6 * t.abs().amax()).any():
        raise ReferenceFormatError(f"{where}: not ascending, as the reference writes them")
    return t.flip(-1).contiguous()


def read_kind(obj: dict, fp: ModelFingerprint, needed: list[int], where: str) -> tuple[dict[int, tuple], dict]:
    """``({layer: (rotation [H, d, d], eigenvalues [H, d] or None)}, the file's top-level fields)``."""
    entries = layer_entries(obj, where)
    H, d = fp.num_kv_heads, fp.head_dim
    extra = sorted(i for i in entries if not 0 <= i < fp.num_layers)
    if extra:
        raise ReferenceFormatError(f"{where}: field layers: layer ids {extra} but the model has {fp.num_layers} layers")
    missing = [i for i in needed if i not in entries]
    if missing:
        raise ReferenceFormatError(f"{where}: field layers: missing layer {missing[0]} "
                                   f"(missing {len(missing)} of the {len(needed)} layers that store INT2)")
    out = {}
    for i, e in sorted(entries.items()):
        ev = e.get("eigenvalues")
        out[i] = (_rotation(e["rotation"], H, d, f"{where}: field layers[{i}].rotation"),
                  None if ev is None else _eigenvalues(ev, H, d, f"{where}: field layers[{i}].eigenvalues"))
    top = {k: v for k, v in obj.items() if k != "layers" and isinstance(v, (str, int, float, bool, type(None)))}
    top["layer_keys"] = "str" if any(isinstance(k, str) for k in obj["layers"]) else "int"
    top["layer_ids"] = sorted(out)  # the others are identity (bf16 layers): export leaves them out
    top["per_head"] = any(e["rotation"].dim() == 3 for e in entries.values())
    top["eigenvalues"] = all(ev is not None for _, ev in out.values())
    return out, top


def import_rotations(folder: str | Path, config, recipe: ReferenceRecipe = ReferenceRecipe(),
                     bf16_layers: frozenset[int] = frozenset()) -> Artifact:
    """Our artifact from the reference files in ``folder`` for the model of ``config``.

    ``bf16_layers`` are layers that never store INT2 (sliding-window layers): the files may omit them."""
    folder = Path(folder)
    fp = ModelFingerprint.from_config(config)
    needed = [i for i in range(fp.num_layers) if i not in bf16_layers]
    group = default_group(fp.head_dim, min(recipe.group_size, fp.head_dim))
    tensors, imported = {}, {}
    for kind, path in find_files(folder).items():
        obj = read_file(path)
        layers, top = read_kind(obj, fp, needed, str(path))
        tensors |= _stack(kind, layers, fp)
        imported[kind] = {"file": path.name, "archive_name": top.pop("_archive"), **top}
    defaults = ReferenceRecipe()
    overrides = {f.name: getattr(recipe, f.name) for f in fields(recipe) if getattr(recipe, f.name) != getattr(defaults, f.name)}
    clips = {"key": [recipe.key_clip] * fp.num_layers, "value": [recipe.value_clip] * fp.num_layers}
    options = {"source": "reference", "recipe": asdict(recipe), "overrides": overrides}
    calibration = {"source": f"imported from {folder}"}
    manifest = new_manifest(fp, options, group, clips, calibration, imported=imported)
    art = Artifact(manifest, tensors)
    art.validate(fp)
    return art


def _stack(kind: str, layers: dict[int, tuple], fp: ModelFingerprint) -> dict[str, torch.Tensor]:
    """Our ``{kind}.*`` tensors ``[L, H, ...]``; layers without an entry: identity, zero eigenvalues."""
    L, H, d = fp.num_layers, fp.num_kv_heads, fp.head_dim
    rot = torch.eye(d).expand(L, H, d, d).clone()
    evals = torch.zeros(L, H, d)
    for i, (r, ev) in layers.items():
        rot[i] = r
        if ev is not None:
            evals[i] = ev
    return {f"{kind}.rotation": rot, f"{kind}.eigvecs": rot.clone(), f"{kind}.eigenvalues": evals,
            f"{kind}.mean": torch.zeros(L, H, d)}


def export_rotations(art: Artifact, out_dir: str | Path, name: str | None = None) -> tuple[list[Path], list[str]]:
    """Write ``art``'s rotations as reference files; returns (files, what the format cannot carry).

    A layer's heads sharing one rotation give a ``[d, d]`` entry (format 1), per-head rotations
    ``[H, d, d]`` (format 2). An imported artifact writes back its files' names and top-level
    fields and only the layers they held; a calibrated one leaves out its ``bf16_layers`` (sliding-window
    layers, never calibrated), as the reference's files for hybrid models do."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    imported = art.manifest.get("imported", {})
    name = name or f"{art.fingerprint.architecture}-{art.fingerprint.config_hash}"
    paths = []
    for kind, prefix in KINDS.items():
        meta = imported.get(kind, {})
        obj = _reference_object(art, kind, meta)
        path = out / meta.get("file", f"{prefix}_rotation_{name}.pt")
        torch.save(obj, path)
        paths.append(path)
    return paths, dropped_fields(art)


def _reference_object(art: Artifact, kind: str, meta: dict) -> dict:
    rot, evals = art.tensors[f"{kind}.rotation"], art.tensors[f"{kind}.eigenvalues"]
    shared = not meta["per_head"] if meta else bool((rot == rot[:, :1]).all())
    layers = {}
    bf16 = set(art.manifest.get("bf16_layers", ()))  # layers that store no INT2 (sliding): not in the files
    for i in meta.get("layer_ids", [i for i in range(rot.shape[0]) if i not in bf16]):
        key = str(i) if meta.get("layer_keys") == "str" else i
        entry = {"layer_id": key, "rotation": (rot[i, 0] if shared else rot[i]).clone()}
        if meta.get("eigenvalues", True):
            entry["eigenvalues"] = (evals[i, 0] if shared else evals[i]).flip(-1).clone()
        layers[key] = entry
    options = art.manifest.get("options", {})
    objective = {"key": "query_second_moment",
                 "value": "attention_output_second_moment" if options.get("value_objective") != "proxy"
                 else "value_weighted_by_key_logit"}[kind]
    top = {"format_version": 1 if shared else 2, "objective": objective,
           "source_grouping": "layer_mean" if shared else "per_kv_head"}
    top |= {k: v for k, v in meta.items() if k in ("format_version", "objective", "source_grouping")}  # as read
    return {**top, "layers": layers}


def dropped_fields(art: Artifact) -> list[str]:
    """What of ``art`` the reference format cannot carry (the exporter reports it)."""
    out = []
    for kind in KINDS:
        if f"{kind}.scale" in art.tensors:
            out.append(f"{kind}.scale (importance scaling)")
        if art.tensors[f"{kind}.mean"].any():
            out.append(f"{kind}.mean (centering)")
        if f"{kind}.levels" in art.tensors:
            out.append(f"{kind}.levels (2-bit level tables)")
    clips = art.manifest["clip"]
    if any(c != clips["key"][0] for c in clips["key"]) or any(c != clips["value"][0] for c in clips["value"]):
        out.append("per-layer clip ratios (fitted)")
    out.append(f"clip ratios and group size (key {clips['key'][0]:g}, value {clips['value'][0]:g}, "
               f"G={art.manifest['group_size']}: the reference's recipe sets them)")
    return out
