"""The 2-bit level tables of ``oscarkv.quant.int2``: the uniform table is today's encoder bit for bit (ties
included), codes are the nearest level, the artifact validates and serves the tables only where asked (an old
artifact serves bit-identically), and the Lloyd-Max fit of ``oscarkv.calibrate.levels``."""

from dataclasses import replace

import pytest
import torch

from oscarkv.calibrate.levels import fit_levels, lloyd_max
from oscarkv.config import KVConfig
from oscarkv.quant.artifact import Artifact, ArtifactError
from oscarkv.quant.codec import TensorCodec, with_bits
from oscarkv.quant.int2 import UNIFORM, boundaries, dequantize, levels_error, quantize, quantize_codes

LM = (0.0, 0.8125, 2.1875, 3.0)


def _ties() -> torch.Tensor:
    """Groups of 8 whose min 0 and max 3 give s = 1, m = 0 (fp16-exact), so y = x: values at and one fp32 ulp
    around every rounding point (0.5 - 2^-25 rounds up in fl(y + 0.5): the case a plain y >= 0.5 gets wrong)."""
    pts = [0.5, 1.5, 2.5]
    vals = [v for p in pts for v in (p, torch.tensor(p).nextafter(torch.tensor(0.0)).item(),
                                     torch.tensor(p).nextafter(torch.tensor(3.0)).item())]
    vals += [0.5 - 2**-25, 0.5 - 2**-24, 0.25, 2.9999998, 0.0, 3.0]
    rows = [[0.0, 3.0, v, v, v, v, v, v] for v in vals]
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize("group", [4, 8, 64])
def test_uniform_table_is_todays_encoder_bit_for_bit(group):
    g = torch.Generator().manual_seed(group)
    x = torch.cat([torch.randn(64, 128, generator=g) * 10 ** torch.randn(64, 1, generator=g),
                   torch.zeros(1, 128), torch.full((1, 128), 1.7)])  # s == 0 groups too
    ties = _ties().repeat(1, 16)[:, :128]
    for data in (x, ties):
        mine, theirs = quantize_codes(data, 2, group, UNIFORM), quantize_codes(data, 2, group)
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
        assert torch.equal(dequantize(quantize(data, 2, group, UNIFORM), 2, group), dequantize(quantize(data, 2, group), 2, group))


def test_codes_are_the_nearest_level():
    y = torch.rand(4096) * 3
    x = torch.cat([torch.zeros(4096, 1), torch.full((4096, 1), 3.0), y[:, None], y[:, None]], 1)  # s = 1, m = 0
    codes = quantize_codes(x, 2, 4, LM)[0][:, 2].long()
    nearest = (y[:, None] - torch.tensor(LM)).abs().argmin(1)
    assert torch.equal(codes, nearest)
    assert boundaries(LM) == (0.90625, 2.0, 3.09375)
    x_hat = dequantize(quantize(x, 2, 4, LM), 2, 4, LM)
    assert torch.equal(x_hat[:, 2], torch.tensor(LM)[nearest])
    assert torch.equal(x_hat[:, :2], x[:, :2]), "the endpoints stay exact"


@pytest.mark.parametrize("table,why", [((0.0, 1.0, 2.0), "4 finite"), ((0.1, 1.0, 2.0, 3.0), "endpoints"),
                                       ((0.0, 2.0, 1.0, 3.0), "increase"), ((0.0, 1.0001, 2.0, 3.0), "fp16")])
def test_levels_error_names_the_fault(table, why):
    assert why in levels_error(table)
    assert levels_error(LM) is None and levels_error(UNIFORM) is None


def _artifact(levels=None) -> Artifact:
    from tests.engine.conftest import L, make_artifact, tiny_config

    art = make_artifact(tiny_config())
    if levels is not None:
        art.tensors |= {f"{k}.levels": torch.tensor([levels] * L, dtype=torch.float32) for k in ("key", "value")}
    return art


def test_artifact_validates_level_tables(tmp_path):
    _artifact(LM).save(tmp_path / "ok")
    assert Artifact.load(tmp_path / "ok").levels("value", 1) == LM
    bad = _artifact(LM)
    bad.tensors["value.levels"][1, 1] = 2.5  # l1 > l2
    with pytest.raises(ArtifactError, match=r"tensor value.levels: layer 1: levels must increase"):
        bad.validate()
    bad.tensors["value.levels"] = torch.zeros(2, 3)
    with pytest.raises(ArtifactError, match=r"tensor value.levels: shape mismatch"):
        bad.validate()


def test_codec_takes_levels_only_where_asked():
    art = _artifact(LM)
    uniform, lm = (art.codec(KVConfig(group_size=32, levels=lv), 32) for lv in ("uniform", "lloyd_max"))
    assert all(c.key.levels is None and c.value.levels is None for c in uniform.layers)
    assert all(c.key.levels == LM == c.value.levels for c in lm.layers)
    k4 = art.codec(KVConfig(group_size=32, levels="lloyd_max", key_bits=4), 32).layers[0]
    assert k4.key.levels is None and k4.value.levels == LM, "4-bit codes stay uniform"
    with pytest.raises(ArtifactError, match="key.levels/value.levels: missing"):
        _artifact().codec(KVConfig(group_size=32, levels="lloyd_max"), 32)
    with pytest.raises(ValueError, match="KVConfig.levels"):
        KVConfig("naive", levels="lloyd_max")


def test_old_artifact_serves_bit_identically():
    """An artifact without tables, and one with tables served uniform, encode exactly as before."""
    x = torch.randn(40, 2, 32)
    old, new = (a.codec(KVConfig(group_size=32), 32).layers[0].key for a in (_artifact(), _artifact(LM)))
    base = TensorCodec(2, 32, old.rotation, old.mean, old.clip)
    assert all(torch.equal(a, b) for a, b in zip(old.encode(x), base.encode(x)))
    assert all(torch.equal(a, b) for a, b in zip(new.encode(x), base.encode(x)))
    assert with_bits(replace(base, levels=LM), 4).levels is None


def test_lloyd_max_fits_the_distribution():
    g = torch.Generator().manual_seed(0)
    flat = torch.rand(200_000, generator=g) * 3
    assert lloyd_max(flat) == pytest.approx((0.0, 1.0, 2.0, 3.0), abs=0.01)
    peaked = (1.5 + 0.5 * torch.randn(200_000, generator=g)).clamp(0, 3)  # mass near the middle
    table = lloyd_max(peaked)
    assert 1.0 < table[1] < 1.5 < table[2] < 2.0 and levels_error(table) is None

    def mse(t):
        return (peaked[:, None] - torch.tensor(t)).abs().min(1).values.square().mean()
    assert mse(table) < 0.8 * mse(UNIFORM)


def test_fit_levels_lowers_the_codec_error():
    """On Gaussian rows (one group per head) the fitted table reconstructs better than the uniform one."""
    x = torch.randn(512, 2, 32, generator=torch.Generator().manual_seed(1))
    codec = TensorCodec(2, 32, clip=0.95)
    table = fit_levels(codec, x)
    err = [(c.fake(x) - x).square().mean() for c in (codec, replace(codec, levels=table))]
    assert err[1] < err[0], (table, err)  # a few percent here: the endpoints are held
