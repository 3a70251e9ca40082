"""Per-layer precision allocation in the numeric spec: each layer's key and value bits
(``KVConfig.layer_key_bits``/``layer_value_bits``), validated, counted per layer by BPE, recorded by
the artifact's recipe and checked on load."""

import json

import pytest
import torch

from oscarkv.config import KVConfig
from oscarkv.quant.artifact import ArtifactError, apply_recipe, describe_recipe
from oscarkv.quant.bpe import bits_per_element
from oscarkv.quant.codec import build_codec
from tests.quant.test_artifact import D, H, L, make_artifact, tiny_config

MIXED = dict(layer_key_bits=(4, 2), layer_value_bits=(2, 4))


@pytest.mark.parametrize("method", ["naive", "quarot", "oscar"])
def test_equal_layers_are_the_uniform_recipe(method):
    """An allocation giving every layer the same bits builds the uniform codec, BPE to the last bit."""
    art = make_artifact(tiny_config())
    uniform = build_codec(KVConfig(method, key_bits=4, group_size=D), L, H, D, art)
    per_layer = build_codec(KVConfig(method, group_size=D, layer_key_bits=(4,) * L, layer_value_bits=(2,) * L),
                            L, H, D, art)
    for a, b in zip(per_layer.layers, uniform.layers):
        for x, y in ((a.key, b.key), (a.value, b.value)):
            assert same_codec(x, y)
    for t in (100, 4096, 1 << 20):
        assert per_layer.bpe(t) == uniform.bpe(t)


def same_codec(x, y) -> bool:
    """Every field equal, tensors element for element."""
    tensors = ("rotation", "mean", "inverse")
    plain = all(getattr(x, f) == getattr(y, f) for f in ("bits", "group", "clip", "per_channel", "levels"))
    return plain and all((getattr(x, f) is None and getattr(y, f) is None) or torch.equal(getattr(x, f), getattr(y, f))
                         for f in tensors)


@pytest.mark.parametrize("method", ["naive", "oscar"])
def test_each_layer_stores_its_bits_and_bpe_counts_each(method):
    art = make_artifact(tiny_config())
    kv = KVConfig(method, group_size=D, **MIXED)
    codec = build_codec(kv, L, H, D, art)
    assert [(x.key.bits, x.value.bits) for x in codec.layers] == [(4, 2), (2, 4)]
    assert codec.layers[0].key.clip is None and codec.layers[1].key.clip == (0.9 if method == "oscar" else None)
    t, hist = 4096, 4096 - 64 - 256  # the default windows: sink 64, recent 256, page 64
    want = sum(0.5 * (bits_per_element(hist, t - hist, kb, D) + bits_per_element(hist, t - hist, vb, D))
               for kb, vb in ((4, 2), (2, 4))) / L
    assert codec.bpe(t) == pytest.approx(want, rel=1e-12)
    assert kv.label() == f"{method}-k4x1-v4x1+win"


def test_allocations_are_validated():
    with pytest.raises(ValueError, match="layer_key_bits holds 2 or 4"):
        KVConfig("oscar", layer_key_bits=(3, 2))
    with pytest.raises(ValueError, match="layer_value_bits holds 2 or 4 per layer and applies to"):
        KVConfig("kivi", layer_value_bits=(4, 2))
    with pytest.raises(ValueError, match="must name the same layers"):
        KVConfig("oscar", layer_key_bits=(4, 2), layer_value_bits=(2,))
    with pytest.raises(ValueError, match="layer_key_bits: 3 values for a model of 2 layers"):
        build_codec(KVConfig("oscar", group_size=D, layer_key_bits=(4, 2, 2)), L, H, D, make_artifact(tiny_config()))


def test_the_recipe_records_restores_and_checks_the_allocation(tmp_path):
    from oscarkv.quant.artifact import Artifact

    art = make_artifact(tiny_config())
    art.manifest["recipe"] = {"sink": 8, "recent": 24, "page_size": 8, "bpe": 3.1, "context": 512,
                              "objective": "development NIAH answer NLL", "dev_samples": 2,
                              "layer_key_bits": [4, 2], "layer_value_bits": [2, 2]}
    kv = apply_recipe(KVConfig("oscar", group_size=D), art)
    assert (kv.layer_bits(0), kv.layer_bits(1)) == ((4, 2), (2, 2))
    line = describe_recipe(kv, art)
    assert "per-layer bits keys 42 values 22" in line and "the artifact's recipe" in line
    assert Artifact.load(art.save(tmp_path / "ok")).manifest["recipe"]["layer_key_bits"] == [4, 2]
    del art.manifest["recipe"]["layer_key_bits"], art.manifest["recipe"]["layer_value_bits"]  # recipes before it
    assert not apply_recipe(KVConfig("oscar", group_size=D), art).allocated
    m = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    m["recipe"]["layer_key_bits"] = [4, 2, 2]  # written by hand: save() validates
    (tmp_path / "ok" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=r"manifest.json: field recipe.layer_key_bits: expected 2 or 4 for each of 2"):
        Artifact.load(tmp_path / "ok")


def test_serve_flags_take_the_recipe_allocation_unless_bits_are_given():
    from oscarkv.cli.flags import engine_config
    from oscarkv.cli.main import build_parser

    art = make_artifact(tiny_config())
    art.manifest["recipe"] = {"sink": 64, "recent": 128, "page_size": 64, "layer_key_bits": [4, 2],
                              "layer_value_bits": [2, 2]}

    def kv(*flags):
        return engine_config(build_parser().parse_args(["generate", "--prompt", "x", *flags]), art).kv

    assert kv().layer_key_bits == (4, 2) and kv().recent == 128
    assert not kv("--key-bits", "4").layer_key_bits and kv("--key-bits", "4").layer_value_bits == (2, 2)
