"""The precision ladder in the numeric spec: key and value bits chosen independently (INT2, K4V2,
K2V4, INT4), 4-bit codes as two INT2 planes, bits counted by BPE and recorded by the recipe."""

import pytest
import torch

from oscarkv.config import RUNGS, KVConfig, RecipeSearchConfig
from oscarkv.quant.artifact import apply_recipe, describe_recipe
from oscarkv.quant.bpe import bits_per_element
from oscarkv.quant.codec import build_codec
from oscarkv.quant.int2 import Packed, dequantize, quantize
from tests.quant.test_artifact import D, H, L, make_artifact, tiny_config


@pytest.mark.parametrize("group", [8, 16])
def test_int4_is_the_low_plane_plus_four_times_the_high_plane(group):
    """What the kernels rely on: a 4-bit row dequantizes as an INT2 row (scale s, zero m) of its low
    plane plus an INT2 row (scale 4s, zero 0) of its high plane."""
    x = torch.randn(5, 3, 32) * 3
    p = quantize(x, 4, group)
    lo, hi = p.codes.split(8, -1)  # [.., 32 / 4] bytes each
    low = dequantize(Packed(lo, p.scale, p.zero), 2, group)
    high = dequantize(Packed(hi, (4 * p.scale.float()).half(), torch.zeros_like(p.zero)), 2, group)
    torch.testing.assert_close(low + high, dequantize(p, 4, group), rtol=0, atol=1e-6)


@pytest.mark.parametrize("method", ["naive", "quarot", "oscar"])
@pytest.mark.parametrize("rung", list(RUNGS))
def test_each_rung_sets_the_bits_of_its_kind(method, rung):
    kb, vb = RUNGS[rung]
    art = make_artifact(tiny_config())
    kv = KVConfig(method, key_bits=kb, value_bits=vb, group_size=D)
    codec = build_codec(kv, L, H, D, art)
    for layer in codec.layers:
        assert (layer.key.bits, layer.value.bits) == (kb, vb)
        # 4-bit kinds are not clipped (the artifact's clips were fitted for INT2); INT2 keeps them
        assert layer.key.clip == (0.9 if method == "oscar" and kb == 2 else None)
    assert codec.bpe(1 << 20) == pytest.approx(0.5 * (bits_per_element(1, 0, kb, D) + bits_per_element(1, 0, vb, D)),
                                               rel=1e-3)
    assert kv.label() == (method if rung == "int2" else f"{method}-{rung}") + "+win"


def test_more_bits_store_each_kind_more_accurately():
    art = make_artifact(tiny_config())
    x = torch.randn(64, H, D) * torch.linspace(0.2, 3, D)
    err = {}
    for rung, (kb, vb) in RUNGS.items():
        layer = build_codec(KVConfig("oscar", key_bits=kb, value_bits=vb, group_size=D), L, H, D, art).layers[0]
        err[rung] = [float((c.fake(x) - x).norm()) for c in (layer.key, layer.value)]
    assert err["k4v2"][0] < err["int2"][0] / 2 and err["k4v2"][1] == err["int2"][1]
    assert err["k2v4"][1] < err["int2"][1] / 2 and err["k2v4"][0] == err["int2"][0]
    assert err["int4"] == [err["k4v2"][0], err["k2v4"][1]]


def test_bits_are_validated():
    with pytest.raises(ValueError, match="key_bits must be 2 or 4"):
        KVConfig("oscar", key_bits=3)
    with pytest.raises(ValueError, match="fixes its own bits"):
        KVConfig("kivi", value_bits=4)
    with pytest.raises(ValueError, match="rungs: unknown"):
        RecipeSearchConfig(rungs=("int3",))
    assert KVConfig("oscar", key_bits=4).without_windows().bits == (4, 2)


def test_the_recipe_records_and_restores_the_bits():
    art = make_artifact(tiny_config())
    art.manifest["recipe"] = {"sink": 8, "recent": 24, "page_size": 8, "key_bits": 4, "value_bits": 2, "bpe": 4.1,
                              "context": 512, "objective": "development NIAH answer NLL", "dev_samples": 2}
    kv = apply_recipe(KVConfig("oscar", group_size=D), art)
    assert kv.bits == (4, 2) and (kv.sink, kv.recent) == (8, 24)
    assert "key bits 4, value bits 2" in describe_recipe(kv, art) and "the artifact's recipe" in describe_recipe(kv, art)
    del art.manifest["recipe"]["key_bits"], art.manifest["recipe"]["value_bits"]  # recipes before the ladder
    assert apply_recipe(KVConfig("oscar", key_bits=4, group_size=D), art).bits == (2, 2)


def test_the_recipe_search_offers_each_rung_within_the_budget():
    from oscarkv.eval.objective import window_codecs

    art = make_artifact(tiny_config())
    loaded = type("Loaded", (), {"model": type("Model", (), {"config": tiny_config()})()})()
    codecs = window_codecs(loaded, art, 4096, 5.0, KVConfig(page_size=8), (0,), (0, 64), tuple(RUNGS))
    # G = 16: INT2 4 bits, K4V2/K2V4 5 bits, INT4 6 bits per element before windows
    assert set(codecs) == {"oscar s=0 r=0", "oscar s=0 r=64", "oscar-k4v2 s=0 r=0", "oscar-k2v4 s=0 r=0"}
    assert codecs["oscar-k2v4 s=0 r=0"].config.bits == (2, 4)


def test_generate_and_serve_flags_choose_the_bits_over_the_recipe():
    from oscarkv.cli.flags import UserError, engine_config
    from oscarkv.cli.main import build_parser

    art = make_artifact(tiny_config())
    art.manifest["recipe"] = {"sink": 64, "recent": 128, "page_size": 64, "key_bits": 4, "value_bits": 2}

    def kv(*flags):
        return engine_config(build_parser().parse_args(["generate", "--prompt", "x", *flags]), art).kv

    assert (kv().bits, kv().recent) == ((4, 2), 128)  # the recipe's windows and bits
    assert (kv("--value-bits", "4").bits, kv("--value-bits", "4").recent) == ((4, 4), 128)  # a flag overrides one
    assert kv("--recent", "256", "--key-bits", "4", "--value-bits", "4").bits == (4, 4)
    assert (kv("--recent", "256").bits, kv("--recent", "256").recent) == ((4, 2), 256)  # a window over the recipe
    assert kv("--kv", "int4").method == "int4"
    with pytest.raises(UserError, match="fixes its own bits"):
        kv("--kv", "int4", "--key-bits", "4")


def test_bench_attention_counts_the_bytes_of_each_rung():
    """``oscarkv bench attention --key-bits 4`` (the GPU check of a rung) divides time into these bytes."""
    from oscarkv.bench.attention import AttentionBench, cache_bytes
    from oscarkv.quant.bpe import tiers

    cfg = AttentionBench()
    hist = tiers(32768, cfg.sink, cfg.recent, cfg.page_size).history
    int2 = cache_bytes(cfg, 32768, 2, True)
    for kb, vb in RUNGS.values():
        rung = AttentionBench(key_bits=kb, value_bits=vb)
        extra = 2 * cfg.kv_heads * hist * cfg.head_dim * (kb + vb - 4) // 8  # batch 2
        assert cache_bytes(rung, 32768, 2, True) - int2 == extra


def test_pools_are_sized_for_the_stored_bits():
    """A 4-bit kind costs ``d/4`` more code bytes per token and head than INT2 (``int4``: both kinds)."""
    from oscarkv.bench.capacity import geometry
    from oscarkv.bench.configs import CapacityBench

    cfg = CapacityBench()
    int2, int4 = (geometry(cfg, m) for m in ("naive", "int4"))
    assert int4.bits == (4, 4) and int2.bits == (2, 2)
    per_token = int2.num_layers * int2.num_kv_heads * int2.page_size
    assert int4.int2_page_bytes() - int2.int2_page_bytes() == per_token * 2 * int2.head_dim // 4
