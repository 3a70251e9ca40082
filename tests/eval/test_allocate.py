"""The greedy per-layer allocation under a bits-per-element budget, and its record in the recipe."""

from dataclasses import replace

import pytest

from oscarkv.config import KVConfig, RecipeSearchConfig
from oscarkv.eval.allocate import Sensitivity, allocate, allocation_codecs, raised, sensitivities
from oscarkv.eval.objective import DevScore, recipe_record
from oscarkv.quant.artifact import apply_recipe
from oscarkv.quant.codec import build_codec
from tests.quant.test_artifact import D, H, make_artifact, tiny_config

L = 6


def artifact():
    """The tiny test artifact with ``L`` layers (its two layers' tensors repeated)."""
    art = make_artifact(tiny_config(num_hidden_layers=L))
    art.tensors = {k: v.repeat(L // 2, *(1,) * (v.dim() - 1)) for k, v in art.tensors.items()}
    art.manifest["clip"] = {"key": [0.9] * L, "value": [1.0] * L}
    art.validate()
    return art


@pytest.fixture(scope="module")
def build():
    art = artifact()
    return lambda kv: build_codec(kv, L, H, D, art)


def test_greedy_raises_the_largest_gains_within_the_budget(build):
    base = KVConfig("oscar", group_size=D, sink=0, recent=64, page_size=8)
    gains = [0.05, 0.3, -0.1, 0.2, 0.01, 0.25]
    sens = [Sensitivity(i, "key", g, 0.01) for i, g in enumerate(gains)]
    one = build(raised(base, L, frozenset({(0, "key")}))).bpe(4096) - build(base).bpe(4096)  # a raise's cost
    budget = build(base).bpe(4096) + 3.5 * one
    kv = allocate(sens, base, L, build, 4096, budget)
    assert kv.layer_key_bits == (2, 4, 2, 4, 2, 4) and kv.layer_value_bits == (2,) * L  # layers 1, 5, 3
    assert build(kv).bpe(4096) <= budget < build(raised(kv, L, frozenset({(0, "key")}))).bpe(4096)
    assert allocate(sens, base, L, build, 4096, build(base).bpe(4096) - 0.01) is None  # the base does not fit
    # negative gains are never bought, however large the budget
    assert allocate(sens, base, L, build, 4096, 99.0).layer_key_bits[2] == 2


def test_allocations_per_window_and_their_record(build):
    windows = {f"oscar s=0 r={r}": build(KVConfig("oscar", group_size=D, sink=0, recent=r, page_size=8)) for r in (64, 128)}
    windows["oscar-k4v2 s=0 r=64"] = build(KVConfig("oscar", group_size=D, sink=0, recent=64, page_size=8, key_bits=4))
    sens = [Sensitivity(i, "key", 0.1 * (i + 1), 0.01) for i in range(L)]
    budget = windows["oscar s=0 r=128"].bpe(4096) + 0.35
    out = allocation_codecs(sens, windows, L, build, 4096, budget)
    small = out["oscar-k4x" + str(sum(b == 4 for b in out_bits(out, 64))) + " s=0 r=64"]
    assert sum(b == 4 for b in out_bits(out, 64)) > sum(b == 4 for b in out_bits(out, 128))  # a smaller window buys more
    assert all(c.bpe(4096) <= budget for c in out.values()) and small.config.layer_key_bits[-1] == 4
    scores = {k: DevScore(0.1, 1.0, (0.1,)) for k in out}
    label = next(iter(out))
    rec = recipe_record(label, scores, out, 4096, {"dev_samples": 1})
    assert rec["layer_key_bits"] == list(out[label].config.layer_key_bits)
    assert all("layer_key_bits" in c for c in rec["candidates"])
    art = artifact()
    art.manifest["recipe"] = rec
    art.validate()
    assert apply_recipe(KVConfig("oscar", group_size=D), art).layer_key_bits == out[label].config.layer_key_bits


def out_bits(out: dict, recent: int) -> tuple[int, ...]:
    return next(c.config.layer_key_bits for k, c in out.items() if k.endswith(f"r={recent}"))


def test_sensitivities_are_paired_gains():
    scores = {"base": DevScore(0.5, 0.5, (0.4, 0.6, 0.5)), "key 0": DevScore(0.3, 1, (0.2, 0.4, 0.3)),
              "key 1": DevScore(0.5, 0.5, (0.5, 0.5, 0.5))}
    s = sensitivities(scores, ("key",), 2, [{"key_error_ratio": 0.2}, {"key_error_ratio": 0.1}])
    assert s[0].gain == pytest.approx(0.2) and s[0].stderr == pytest.approx(0.0) and s[0].predicted == 0.2
    assert s[1].gain == pytest.approx(0.0) and s[1].stderr > 0


def test_allocate_needs_a_budget():
    with pytest.raises(ValueError, match="allocate holds key and/or value and needs max_bpe"):
        RecipeSearchConfig(allocate=("key",))
    with pytest.raises(ValueError, match="allocate holds key"):
        RecipeSearchConfig(allocate=("keys",), max_bpe=3.0)
    assert replace(RecipeSearchConfig(max_bpe=3.0), allocate=("key", "value")).allocate == ("key", "value")


def test_the_report_ranks_by_gain():
    from oscarkv.eval.allocate import report

    sens = [Sensitivity(i, "key", g, 0.01, p) for i, (g, p) in enumerate([(0.1, 0.3), (0.3, 0.5), (-0.1, 0.1)])]
    lines = report(sens)
    assert [line.split("layer")[1].split(":")[0].strip() for line in lines[:3]] == ["1", "0", "2"]
    assert "error ratio 0.500" in lines[0]
