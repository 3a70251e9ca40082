"""The rotation artifact: ``rotations.safetensors`` (fp32 tensors) + ``manifest.json``.

Written once by ``oscarkv calibrate`` and only loaded afterwards (the gpt-fast pattern).
Tensors, stacked over layers (``L`` layers, ``H`` KV heads, head_dim ``d``):

    key.rotation, value.rotation        [L, H, d, d]  R = U·H·P_br (or the chosen ablation)
    key.eigvecs,  value.eigvecs         [L, H, d, d]  U, eigenvalues descending
    key.eigenvalues, value.eigenvalues  [L, H, d]
    key.mean, value.mean                [L, H, d]     zeros when centering is off
    key.scale, value.scale              [L, H, d]     optional importance scaling a > 0 (eigenbasis order)
    key.levels, value.levels            [L, 4]        optional 2-bit level tables (0, l1, l2, 3) per layer

Importance scaling (an extension beyond the paper, ``CalibrationConfig.scaling``): with one
quantization group per head (G = d) an orthogonal R cannot shape the quantization noise —
its weighted error ``σ² tr(C)`` is rotation invariant — so the codec stores
``x (U diag(a) Uᵀ) R``: channel i of the eigenbasis is scaled by ``a_i`` before the Hadamard
mixes it, and the noise it receives shrinks by ``1/a_i``. The codec built here carries the
explicit inverse and the query map ``R⁻ᵀ`` (``oscarkv.quant.codec``). ``rotation`` itself stays
the orthogonal ``U·H·P_br`` and is validated as such; absent ``scale`` means ``a = 1``.

Level tables (``oscarkv.quant.int2``, fitted by ``oscarkv.calibrate.levels``): one per layer for keys
and one for values (per layer, not per head, so a tensor-parallel rank needs no shard of them). They are
served only where ``KVConfig.levels`` is ``lloyd_max`` (the recipe's choice); absent tensors (artifacts
fitted before them) serve uniform levels only, bit-identically to before. Loading checks each row: 4
fp16 values, endpoints 0 and 3, strictly increasing.
The manifest records the format version, the oscarkv version, the model fingerprint, the
method options, the group size, per-layer clip ratios and the calibration data (and, for a
model with sliding-window layers, ``bf16_layers``: those layers hold the identity, unclipped, being
never stored in INT2 nor calibrated). Loading
validates all of it and raises :class:`ArtifactError` naming the offending field — there is
no silent fallback to an identity rotation. Never pickle.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from oscarkv.config import FIXED_BITS, KVConfig, __version__
from oscarkv.quant.codec import KVCodec, LayerCodec, TensorCodec, allocated, check_layer_bits
from oscarkv.quant.int2 import levels_error
from oscarkv.quant.rotation import orthogonality_error

FORMAT_VERSION = 2
TENSOR_FILE = "rotations.safetensors"
MANIFEST_FILE = "manifest.json"
ORTHO_TOL = 1e-4


def new_manifest(fp: ModelFingerprint, options: dict, group: int, clips: dict[str, list[float]],
                 calibration: dict, **extra) -> dict:
    """A manifest of this format: the model it fits, the options it was made with, its group size,
    its per-layer clip ratios (``{"key": [...], "value": [...]}``) and where it came from;
    ``extra`` adds fields (calibration's per-layer summary)."""
    return {"format_version": FORMAT_VERSION, "oscarkv_version": __version__, "model": asdict(fp), "method": "oscar",
            "options": options, "group_size": group, "clip": clips, "calibration": calibration, **extra}


class ArtifactError(ValueError):
    """A rotation artifact that is missing, malformed or made for another model."""


@dataclass(frozen=True)
class ModelFingerprint:
    """What an artifact must agree with: the attention geometry and a hash of the config."""

    architecture: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    config_hash: str

    @classmethod
    def from_config(cls, config) -> ModelFingerprint:
        """Fingerprint of a transformers ``PretrainedConfig`` (architecture, shapes, RoPE)."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
        fields = {
            "architecture": arch,
            "hidden_size": config.hidden_size,
            "intermediate_size": getattr(config, "intermediate_size", None),
            "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "head_dim": head_dim,
            "vocab_size": config.vocab_size,
            "rope": _rope_theta(config),
        }
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
        return cls(arch, config.num_hidden_layers, config.num_attention_heads,
                   config.num_key_value_heads, head_dim, digest)

    @property
    def kv_dims(self) -> tuple[int, int, int]:
        """``(num_layers, num_kv_heads, head_dim)``: the shape arguments of ``build_codec``."""
        return self.num_layers, self.num_kv_heads, self.head_dim


def _rope_theta(config) -> float | None:
    params = getattr(config, "rope_parameters", None) or {}
    return params.get("rope_theta", getattr(config, "rope_theta", None))


@dataclass
class Artifact:
    """A loaded (or freshly fitted) rotation artifact."""

    manifest: dict
    tensors: dict[str, torch.Tensor]

    @property
    def fingerprint(self) -> ModelFingerprint:
        return ModelFingerprint(**self.manifest["model"])

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.validate()
        save_file({k: v.float().contiguous() for k, v in self.tensors.items()}, str(out / TENSOR_FILE),
                  metadata={"format_version": str(FORMAT_VERSION)})
        (out / MANIFEST_FILE).write_text(json.dumps(self.manifest, indent=2) + "\n")
        return out

    @classmethod
    def load(cls, path: str | Path, expect: ModelFingerprint | None = None) -> Artifact:
        """Load and validate; ``expect`` is the fingerprint of the model it will serve. Every fault
        raises :class:`ArtifactError` as one line naming the file, the tensor or field, and the fault."""
        path = Path(path)
        for name in (MANIFEST_FILE, TENSOR_FILE):
            if not (path / name).is_file():
                raise ArtifactError(f"rotation artifact {path}: missing file {name}")
        try:
            manifest = json.loads((path / MANIFEST_FILE).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ArtifactError(f"rotation artifact {path / MANIFEST_FILE}: not valid JSON ({e})") from e
        if not isinstance(manifest, dict):
            raise ArtifactError(f"rotation artifact {path / MANIFEST_FILE}: not a JSON object")
        try:
            tensors = load_file(str(path / TENSOR_FILE))
        except (SafetensorError, OSError, ValueError) as e:  # cut short or overwritten: the header or data do not add up
            raise ArtifactError(f"rotation artifact {path / TENSOR_FILE}: unreadable, truncated or corrupt "
                                f"safetensors file ({e})") from e
        art = cls(manifest, tensors)
        try:
            art.validate(expect)
        except ArtifactError as e:
            where = TENSOR_FILE if str(e).startswith("tensor ") else MANIFEST_FILE
            raise ArtifactError(f"rotation artifact {path / where}: {e}") from e
        return art

    def with_recipe(self, recipe: dict) -> Artifact:
        """The same rotations and clips (tensors shared, not copied) with another serving ``recipe`` in the manifest,
        as ``oscarkv calibrate --max-bpe`` writes one; its per-layer bits are validated."""
        art = Artifact({**self.manifest, "recipe": recipe}, self.tensors)
        art._validate_layer_bits(art.fingerprint)
        return art

    def validate(self, expect: ModelFingerprint | None = None) -> None:
        """Check version, fingerprint, shapes, orthogonality and finiteness; raise naming the field."""
        m = self.manifest
        if m.get("format_version") != FORMAT_VERSION:
            raise ArtifactError(f"field format_version: artifact has {m.get('format_version')!r}, "
                                f"this oscarkv reads {FORMAT_VERSION}")
        try:
            fp = self.fingerprint
        except (KeyError, TypeError) as e:
            raise ArtifactError(f"field model: malformed fingerprint ({e})") from e
        if expect is not None:
            for field, want in asdict(expect).items():
                have = getattr(fp, field)
                if have != want:
                    raise ArtifactError(f"field model.{field}: artifact was calibrated for {have!r}, "
                                        f"but the model has {want!r}")
        self._validate_tensors(fp)
        self._validate_clips(fp)
        self._validate_layer_bits(fp)

    def _validate_tensors(self, fp: ModelFingerprint) -> None:
        L, H, d = fp.num_layers, fp.num_kv_heads, fp.head_dim
        shapes = {f"{kind}.{name}": shape for kind in ("key", "value") for name, shape in
                  (("rotation", (L, H, d, d)), ("eigvecs", (L, H, d, d)), ("eigenvalues", (L, H, d)), ("mean", (L, H, d)))}
        for name, shape in shapes.items():
            t = self.tensors.get(name)
            if t is None:
                raise ArtifactError(f"tensor {name}: missing")
            _check_tensor(name, t, shape, "layers" if t.dim() and t.shape[0] != L else "shape")
        for kind in ("key", "value"):
            t = self.tensors.get(f"{kind}.scale")
            if t is not None:
                _check_tensor(f"{kind}.scale", t, (L, H, d), "shape")
                if (t <= 0).any():
                    raise ArtifactError(f"tensor {kind}.scale: {int((t <= 0).sum())} value(s) <= 0 (the scales must "
                                        f"be positive), e.g. at index {_first(t <= 0)}")
        for kind in ("key", "value"):
            self._validate_levels(kind, L)
        for kind in ("key", "value"):
            err = orthogonality_error(self.tensors[f"{kind}.rotation"])
            if err > ORTHO_TOL:
                raise ArtifactError(f"tensor {kind}.rotation: not orthogonal (max |R Rᵀ - I| = {err:.2e})")

    def _validate_levels(self, kind: str, num_layers: int) -> None:
        t = self.tensors.get(f"{kind}.levels")
        if t is None:
            return
        _check_tensor(f"{kind}.levels", t, (num_layers, 4), "shape")
        for i, row in enumerate(t):
            why = levels_error(row)
            if why:
                raise ArtifactError(f"tensor {kind}.levels: layer {i}: {why}")

    def levels(self, kind: str, layer: int) -> tuple[float, ...] | None:
        """Layer ``layer``'s fitted level table of ``kind``, ``None`` when the artifact holds none."""
        t = self.tensors.get(f"{kind}.levels")
        return None if t is None else tuple(t[layer].tolist())

    def _validate_clips(self, fp: ModelFingerprint) -> None:
        clips = self.manifest.get("clip", {})
        for kind in ("key", "value"):
            vals = clips.get(kind)
            if not isinstance(vals, list) or len(vals) != fp.num_layers:
                raise ArtifactError(f"field clip.{kind}: expected {fp.num_layers} per-layer values, got {vals!r}")
            if any(not isinstance(v, (int, float)) or not 0 < v <= 1 for v in vals):
                raise ArtifactError(f"field clip.{kind}: values must lie in (0, 1], got {vals}")
        g = self.manifest.get("group_size")
        if not isinstance(g, int) or g <= 0 or fp.head_dim % g:
            raise ArtifactError(f"field group_size: {g!r} does not divide head_dim {fp.head_dim}")

    def _validate_layer_bits(self, fp: ModelFingerprint) -> None:
        """A recipe's per-layer allocation (``recipe.layer_key_bits``/``layer_value_bits``): absent (every layer at
        the recipe's bits), or 2 or 4 for each of the model's layers."""
        recipe = self.manifest.get("recipe") or {}
        for name in ("layer_key_bits", "layer_value_bits"):
            vals = recipe.get(name)
            if vals is None:
                continue
            if not isinstance(vals, list) or len(vals) != fp.num_layers or any(v not in (2, 4) for v in vals):
                raise ArtifactError(f"field recipe.{name}: expected 2 or 4 for each of {fp.num_layers} layers, "
                                    f"got {vals!r}")
        heads = recipe.get("layer_key_heads")
        if heads is not None and (not isinstance(heads, list) or len(heads) != fp.num_layers or any(
                not isinstance(h, list) or any(not isinstance(x, int) or not 0 <= x < fp.num_kv_heads for x in h)
                for h in heads)):
            raise ArtifactError(f"field recipe.layer_key_heads: expected, for each of {fp.num_layers} layers, a list of "
                                f"KV heads below {fp.num_kv_heads}, got {heads!r}")

    def summary(self) -> list[str]:
        """The manifest in four lines (for a start-up log): the model, the recipe, the clips, the data."""
        m, fp = self.manifest, self.manifest.get("model", {})
        opts, cal, clips = m.get("options") or {}, m.get("calibration") or {}, m.get("clip") or {}
        recipe = ", ".join(f"{k}={opts[k]}" for k in ("rotation", "center", "clip", "scaling", "value_objective")
                           if k in opts)
        return [f"rotation artifact: format {m.get('format_version')}, oscarkv {m.get('oscarkv_version')}, for "
                f"{fp.get('architecture')} ({fp.get('num_layers')} layers, {fp.get('num_kv_heads')} KV heads, head_dim "
                f"{fp.get('head_dim')}, config {fp.get('config_hash')})",
                f"  recipe: {recipe or 'not recorded'}; group size {m.get('group_size')}",
                f"  clip ratios per layer: keys {_span(clips.get('key'))}, values {_span(clips.get('value'))}",
                f"  calibrated on {cal.get('tokens', '?')} + {cal.get('heldout_tokens', '?')} held-out tokens of "
                f"{cal.get('source', '?')} ({cal.get('seconds', '?')} s)"]

    def codec(self, cfg: KVConfig, group: int) -> KVCodec:
        """OSCAR codecs for every layer at ``cfg``'s key and value bits; the clips were fitted for the
        artifact's group size at 2 bits (4-bit kinds are not clipped: ``codec.with_bits``), and
        ``cfg.key_clip`` replaces the fitted key clips when set; ``cfg.levels == "lloyd_max"`` takes the level
        tables (2-bit kinds only)."""
        if group != self.manifest["group_size"]:
            raise ArtifactError(f"field group_size: artifact was fitted with G={self.manifest['group_size']}, "
                                f"the cache asks for G={group}")
        if cfg.levels == "lloyd_max" and not all(f"{k}.levels" in self.tensors for k in ("key", "value")):
            raise ArtifactError("tensor key.levels/value.levels: missing, but KVConfig.levels is 'lloyd_max' (fit them: "
                                "oscarkv calibrate --rotations DIR --levels uniform,lloyd_max ...)")
        check_layer_bits(cfg, self.fingerprint.num_layers, self.fingerprint.num_kv_heads)
        layers = []
        for i in range(self.fingerprint.num_layers):
            key, value = (self.fitted_codec(kind, i, group) for kind in ("key", "value"))
            if cfg.key_clip is not None:
                key = replace(key, clip=_clip(cfg.key_clip))
            if cfg.levels == "lloyd_max":
                key, value = (replace(c, levels=self.levels(k, i)) for c, k in ((key, "key"), (value, "value")))
            layers.append(allocated(cfg, i, LayerCodec(key, value), self.fingerprint.num_kv_heads))
        return KVCodec(cfg, tuple(layers), group)

    def fitted_codec(self, kind: str, layer: int, group: int) -> TensorCodec:
        """Layer ``layer``'s INT2 codec of ``kind`` as fitted: its transform, mean and clip, uniform levels."""
        return tensor_codec(self.tensors, kind, layer, group, _clip(self.manifest["clip"][kind][layer]))


def _check_tensor(name: str, t: torch.Tensor, shape: tuple, what: str) -> None:
    """Dtype, then shape, then finiteness: the first fault, named."""
    if t.dtype not in (torch.float32, torch.float64):
        raise ArtifactError(f"tensor {name}: dtype {str(t.dtype).removeprefix('torch.')}, but artifacts store float32")
    if tuple(t.shape) != shape:
        raise ArtifactError(f"tensor {name}: {what} mismatch, shape {tuple(t.shape)} but the model needs {shape}")
    bad = ~torch.isfinite(t)
    if bad.any():
        kinds = " and ".join(k for k, m in (("NaN", t.isnan()), ("Inf", t.isinf())) if m.any())
        raise ArtifactError(f"tensor {name}: contains {kinds} ({int(bad.sum())} of {t.numel()} values, "
                            f"the first at index {_first(bad)})")


def _span(values: list[float] | None) -> str:
    return f"{min(values):.2f}-{max(values):.2f} (mean {sum(values) / len(values):.3f})" if values else "none"


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0])


def tensor_codec(tensors: dict[str, torch.Tensor], kind: str, layer: int, group: int,
                 clip: float | None = None) -> TensorCodec:
    """The INT2 codec of one layer and kind from artifact tensors (scaled when ``{kind}.scale`` is present).

    An all-zero mean (an uncentered kind: the recipe centers keys only) becomes ``None``: the same
    numbers, but the engine then keeps the values as views of the model's projection instead of an fp32
    subtraction of zeros per layer and step (0.29 ms of a 5.5 ms Qwen3-4B decode step at 100K on an
    H100, lab/record/benchmarks-log.md, round 7)."""
    rot, mean = tensors[f"{kind}.rotation"][layer], tensors[f"{kind}.mean"][layer]
    mean = mean if mean.any() else None
    scale = tensors.get(f"{kind}.scale")
    if scale is None:
        return TensorCodec(2, group, rot, mean, clip)
    forward, inverse = scaled_transform(tensors[f"{kind}.eigvecs"][layer], scale[layer], rot)
    return TensorCodec(2, group, forward, mean, clip, inverse=inverse)


def scaled_transform(u: torch.Tensor, a: torch.Tensor, rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U diag(a) Uᵀ R, Rᵀ U diag(1/a) Uᵀ)`` per head, fp32 (solved in fp64).

    ``u [H, d, d]`` eigenvectors in columns, ``a [H, d]`` in eigenvalue order, ``rot`` orthogonal."""
    u, a, rot = u.double(), a.double(), rot.double()
    ut = u.transpose(-1, -2)
    forward = (u * a.unsqueeze(-2)) @ ut @ rot
    inverse = rot.transpose(-1, -2) @ (u / a.unsqueeze(-2)) @ ut
    return forward.float().contiguous(), inverse.float().contiguous()


def _clip(c: float) -> float | None:
    return None if c >= 1.0 else float(c)


def apply_recipe(kv: KVConfig, artifact: Artifact | None) -> KVConfig:
    """``kv`` with the windows, key/value bits, key clip and levels the artifact's manifest chose (``recipe``, written by
    ``oscarkv calibrate --max-bpe``/``--tolerance``; bits absent: 2) when ``kv`` is OSCAR and the manifest holds one;
    otherwise ``kv`` unchanged. Fields a user sets go over it: :func:`recipe_with`."""
    recipe = artifact.manifest.get("recipe") if artifact is not None else None
    if kv.method != "oscar" or not recipe:
        return kv
    return replace(kv, sink=recipe["sink"], recent=recipe["recent"], page_size=recipe.get("page_size", kv.page_size),
                   key_bits=recipe.get("key_bits", 2), value_bits=recipe.get("value_bits", 2),
                   key_clip=recipe.get("key_clip"), levels=recipe.get("levels", "uniform"),
                   layer_key_bits=tuple(recipe.get("layer_key_bits", ())),
                   layer_value_bits=tuple(recipe.get("layer_value_bits", ())),
                   layer_key_heads=tuple(map(tuple, recipe.get("layer_key_heads", ()))))


def recipe_with(kv: KVConfig, artifact: Artifact | None, given: dict) -> KVConfig:
    """``kv`` with the artifact's recipe (:func:`apply_recipe`), then the ``KVConfig`` fields ``given`` sets over it: a
    window or page size changes only itself (the per-head bits and the clip stay); key or value bits replace the
    recipe's allocation. A bad value is ``KVConfig``'s ValueError."""
    mine = {f"layer_{k}": () for k in given if k in ("key_bits", "value_bits")}
    mine |= {"layer_key_heads": ()} if "key_bits" in given else {}
    return replace(apply_recipe(kv, artifact), **given, **mine)


def describe_recipe(kv: KVConfig, artifact: Artifact | None) -> str:
    """One start-up line: the windows in use and where they come from."""
    bits = "" if kv.method in FIXED_BITS else f"key bits {kv.key_bits}, value bits {kv.value_bits}, "
    if kv.method != "oscar":
        return f"kv {kv.method}: {bits}sink {kv.sink}, recent {kv.recent}, page {kv.page_size}"
    recipe = artifact.manifest.get("recipe") if artifact is not None else None
    clip = f", key clip {kv.key_clip}" if kv.key_clip is not None else ""
    clip += f", {kv.levels} levels" if kv.levels != "uniform" else ""
    line = f"kv oscar: {bits}sink {kv.sink}, recent {kv.recent}, page {kv.page_size}{clip}"
    if kv.allocated:
        line += f", per-layer bits keys {_bits_row(kv.layer_key_bits)} values {_bits_row(kv.layer_value_bits)}"
    if kv.layer_key_heads:
        line += f", 4-bit key heads per layer {'/'.join(''.join(map(str, h)) or '-' for h in kv.layer_key_heads)}"
    if not recipe:
        return line + " (no recipe in the artifact)"
    theirs = apply_recipe(kv, artifact)
    differ = [n if isinstance(v, tuple) else f"{n} {v}" for n, v in ((f.name, getattr(kv, f.name)) for f in fields(KVConfig))
              if v != getattr(theirs, n)]
    if not differ:
        return (f"{line} (the artifact's recipe: {recipe['bpe']} bits per element at {recipe['context']} tokens, "
                f"chosen on {recipe['objective']} over {recipe.get('dev_samples', '?')} development samples)")
    return f"{line} (set by the caller: the artifact's recipe but {', '.join(differ)})"


def _bits_row(bits: tuple[int, ...]) -> str:
    return "".join(map(str, bits)) if bits else "uniform"
