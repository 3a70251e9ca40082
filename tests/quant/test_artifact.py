"""Artifact save/load and every validation error, each naming its field."""

import json
from dataclasses import asdict

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from oscarkv.config import KVConfig
from oscarkv.quant.artifact import FORMAT_VERSION, MANIFEST_FILE, TENSOR_FILE, Artifact, ArtifactError, ModelFingerprint
from oscarkv.quant.codec import build_codec

L, H, D = 2, 2, 16


def tiny_config(**kw):
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=L, num_attention_heads=4,
                num_key_value_heads=H, head_dim=D, vocab_size=100, architectures=["LlamaForCausalLM"])
    return LlamaConfig(**{**base, **kw})


def make_artifact(config) -> Artifact:
    torch.manual_seed(0)
    q = torch.linalg.qr(torch.randn(L, H, D, D))[0]
    tensors = {}
    for kind in ("key", "value"):
        tensors[f"{kind}.rotation"] = q
        tensors[f"{kind}.eigvecs"] = q
        tensors[f"{kind}.eigenvalues"] = torch.rand(L, H, D).sort(-1, descending=True).values
        tensors[f"{kind}.mean"] = torch.randn(L, H, D)
    manifest = {"format_version": FORMAT_VERSION, "oscarkv_version": "test",
                "model": asdict(ModelFingerprint.from_config(config)), "method": "oscar", "options": {},
                "group_size": D, "clip": {"key": [0.9] * L, "value": [1.0] * L}, "calibration": {}}
    return Artifact(manifest, tensors)


def test_roundtrip_and_codec(tmp_path):
    cfg = tiny_config()
    make_artifact(cfg).save(tmp_path)
    art = Artifact.load(tmp_path, expect=ModelFingerprint.from_config(cfg))
    codec = build_codec(KVConfig("oscar"), L, H, D, art)
    assert codec.layers[0].key.clip == 0.9 and codec.layers[0].value.clip is None
    x = torch.randn(5, H, D)
    layer = codec.layers[1].key
    assert torch.allclose(layer.from_rotated(layer.to_rotated(x)), x, atol=1e-5)


def test_zero_mean_is_no_mean():
    """An uncentered kind (all-zero mean, as the recipe's values) gets no mean: same numbers, and the
    engine keeps such values in the model's dtype (``stored_domain``) instead of subtracting zeros."""
    art = make_artifact(tiny_config())
    art.tensors["value.mean"] = torch.zeros(L, H, D)
    codec = build_codec(KVConfig("oscar"), L, H, D, art)
    assert all(c.value.mean is None and c.key.mean is not None for c in codec.layers)
    x = torch.randn(5, H, D)
    with_zeros = torch.einsum("thd,hde->the", x - 0.0, codec.layers[0].value.rotation)
    assert torch.equal(codec.layers[0].value.to_rotated(x), with_zeros)


def test_oscar_without_artifact_is_an_error():
    with pytest.raises(ValueError, match="artifact"):
        build_codec(KVConfig("oscar"), L, H, D, None)


@pytest.mark.parametrize("change,field", [
    (dict(num_hidden_layers=3), "model.num_layers"),
    (dict(num_key_value_heads=1), "model.num_kv_heads"),
    (dict(head_dim=32), "model.head_dim"),
    (dict(vocab_size=101), "model.config_hash"),
    (dict(architectures=["Qwen2ForCausalLM"]), "model.architecture"),
])
def test_wrong_model_names_field(tmp_path, change, field):
    make_artifact(tiny_config()).save(tmp_path)
    with pytest.raises(ArtifactError, match=field.replace(".", r"\.")):
        Artifact.load(tmp_path, expect=ModelFingerprint.from_config(tiny_config(**change)))


def _corrupt(tmp_path, fn):
    make_artifact(tiny_config()).save(tmp_path)
    tensors = load_file(str(tmp_path / TENSOR_FILE))
    manifest = json.loads((tmp_path / MANIFEST_FILE).read_text())
    fn(tensors, manifest)
    save_file(tensors, str(tmp_path / TENSOR_FILE))
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest))


@pytest.mark.parametrize("fn,match", [
    (lambda t, m: t.__setitem__("key.rotation", t["key.rotation"][:1].contiguous()), "key.rotation: layers"),
    (lambda t, m: t.pop("value.mean"), "value.mean: missing"),
    (lambda t, m: t.__setitem__("key.rotation", t["key.rotation"] * 1.01), "key.rotation: not orthogonal"),
    (lambda t, m: t["value.mean"].__setitem__((0, 0, 0), float("nan")), "value.mean: contains NaN"),
    (lambda t, m: m.__setitem__("format_version", 99), "format_version"),
    (lambda t, m: m["clip"].__setitem__("key", [0.9]), "clip.key"),
    (lambda t, m: m["clip"].__setitem__("value", [1.5, 0.9]), "clip.value"),
    (lambda t, m: m.__setitem__("group_size", 5), "group_size"),
    (lambda t, m: t.__setitem__("key.scale", -torch.ones(L, H, D)), "key.scale"),
    (lambda t, m: t.__setitem__("value.scale", torch.ones(L, H, D + 1)), "value.scale"),
])
def test_corrupt_artifact_names_field(tmp_path, fn, match):
    _corrupt(tmp_path, fn)
    with pytest.raises(ArtifactError, match=match):
        Artifact.load(tmp_path)


def test_missing_files(tmp_path):
    with pytest.raises(ArtifactError, match="manifest.json"):
        Artifact.load(tmp_path)
    make_artifact(tiny_config()).save(tmp_path)
    (tmp_path / TENSOR_FILE).unlink()
    with pytest.raises(ArtifactError, match=TENSOR_FILE):
        Artifact.load(tmp_path)


def test_importance_scaling_is_exact_for_attention(tmp_path):
    """A scaled artifact: the codec's transform is inverted exactly and the query map keeps q·k."""
    art = make_artifact(tiny_config())
    art.tensors["key.scale"] = torch.rand(L, H, D) + 0.2
    art.tensors["value.scale"] = torch.rand(L, H, D) + 0.2
    art.save(tmp_path)
    codec = build_codec(KVConfig("oscar"), L, H, D, Artifact.load(tmp_path)).layers[1]
    x, q = torch.randn(7, H, D, dtype=torch.float64), torch.randn(H, D, dtype=torch.float64)
    for c in (codec.key, codec.value):
        assert torch.allclose(c.from_rotated(c.to_rotated(x)), x.float(), atol=1e-4)
        assert not torch.allclose(c.rotation @ c.rotation.transpose(-1, -2), torch.eye(D).expand(H, D, D), atol=1e-2)
    k = codec.key
    logits = torch.einsum("hd,thd->th", q, x - k.mean.double())
    q_mapped = torch.einsum("hd,hde->he", q, k.query_map().double())
    assert torch.allclose(torch.einsum("he,the->th", q_mapped, k.to_rotated(x).double()), logits, atol=1e-3)


def test_unscaled_codec_maps_queries_by_the_rotation():
    art = make_artifact(tiny_config())
    k = build_codec(KVConfig("oscar"), L, H, D, art).layers[0].key
    assert k.inverse is None and torch.equal(k.query_map(), k.rotation)
