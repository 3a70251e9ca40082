"""The greedy per-layer and per-KV-head allocations under a bits-per-element budget, and their record in the recipe."""

from dataclasses import replace

import pytest

from oscarkv.config import KVConfig, RecipeSearchConfig
from oscarkv.eval.allocate import Sensitivity, allocate, allocation_codecs, raised, sensitivities, sensitivity_codecs
from oscarkv.eval.objective import DevScore, recipe_record, scores_of
from oscarkv.quant.artifact import apply_recipe, describe_recipe
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


@pytest.mark.parametrize("kind", ["key", "key-heads"])
def test_allocate_needs_a_budget(kind):
    with pytest.raises(ValueError, match=r"allocate \(.*\) needs RecipeSearchConfig.max_bpe"):
        RecipeSearchConfig(allocate=(kind,))
    with pytest.raises(ValueError, match=r"allocate: unknown \['keys'\]"):
        RecipeSearchConfig(allocate=("keys",), max_bpe=3.0)
    assert replace(RecipeSearchConfig(max_bpe=3.0), allocate=(kind, "value")).allocate == (kind, "value")


def test_key_and_key_heads_are_refused_together():
    with pytest.raises(ValueError, match="allocate: key and key-heads both raise keys"):
        RecipeSearchConfig(allocate=("key", "key-heads"), max_bpe=3.0)


def test_the_report_ranks_by_gain():
    from oscarkv.eval.allocate import report

    sens = [Sensitivity(i, "key", g, 0.01, p) for i, (g, p) in enumerate([(0.1, 0.3), (0.3, 0.5), (-0.1, 0.1)])]
    lines = report(sens)
    assert [line.split("layer")[1].split(":")[0].strip() for line in lines[:3]] == ["1", "0", "2"]
    assert "error ratio 0.500" in lines[0]


def test_key_head_sensitivities_raise_one_head_each(build):
    """``key-heads``: one configuration per (layer, KV head), each storing exactly that head's keys at 4 bits, the
    per-layer bits untouched."""
    base = KVConfig("oscar", group_size=D, sink=0, recent=64, page_size=8)
    codecs = sensitivity_codecs(base, L, build, ("key-heads",), H)
    assert set(codecs) == {"base"} | {f"key-head {i}.{h}" for i in range(L) for h in range(H)}
    for i in range(L):
        for h in range(H):
            codec = codecs[f"key-head {i}.{h}"]
            want = [tuple(4 if (j, k) == (i, h) else 2 for k in range(H)) if j == i else () for j in range(L)]
            assert [layer.key.head_bits for layer in codec.layers] == want
            assert all(layer.key.bits == layer.value.bits == 2 for layer in codec.layers)
            assert codec.config.layer_key_bits == codec.config.layer_value_bits == ()
    assert all(not layer.key.head_bits for layer in codecs["base"].layers)
    with pytest.raises(ValueError, match="key-heads needs the model's number of KV heads"):
        sensitivity_codecs(base, L, build, ("key-heads",))


def test_key_head_sensitivities_are_paired_gains_per_head():
    scores = {"base": DevScore(0.5, 0.5, (0.4, 0.6)), "key-head 0.0": DevScore(0.3, 1, (0.2, 0.4)),
              "key-head 0.1": DevScore(0.5, 0.5, (0.5, 0.5))}
    s = sensitivities(scores, ("key-heads",), 1, [{"key_error_ratio": 0.2}], num_kv_heads=2)
    assert [(x.layer, x.kind, x.head) for x in s] == [(0, "key-heads", 0), (0, "key-heads", 1)]
    assert s[0].gain == pytest.approx(0.2) and s[0].predicted is None  # the summary predicts layers, not heads
    assert s[0].unit == (0, "key-heads", 0) and Sensitivity(3, "key", 0.1, 0.0).unit == (3, "key")


def head_sens(gains: list[list[float]]) -> list[Sensitivity]:
    """Hand-made ``key-heads`` sensitivities: ``gains[layer][head]``."""
    return [Sensitivity(i, "key-heads", g, 0.01, head=h) for i, row in enumerate(gains) for h, g in enumerate(row)]


def test_greedy_raises_the_heads_of_largest_gain_within_the_budget(build):
    base = KVConfig("oscar", group_size=D, sink=0, recent=64, page_size=8)
    sens = head_sens([[0.05, 0.3], [-0.1, 0.2], [0.01, 0.25], [0.0, 0.02], [0.15, -0.3], [0.04, 0.03]])
    one = build(raised(base, L, frozenset({(0, "key-heads", 0)}))).bpe(4096) - build(base).bpe(4096)
    assert one == pytest.approx(build(raised(base, L, frozenset({(4, "key-heads", 1)}))).bpe(4096) - build(base).bpe(4096))
    budget = build(base).bpe(4096) + 3.5 * one
    kv = allocate(sens, base, L, build, 4096, budget)
    assert kv.layer_key_heads == ((1,), (1,), (1,), (), (), ())  # 0.3, 0.25, 0.2
    assert kv.layer_key_bits == kv.layer_value_bits == () and kv.label() == "oscar-kh4x3+win"
    assert build(kv).bpe(4096) <= budget < build(raised(kv, L, frozenset({(4, "key-heads", 0)}))).bpe(4096)
    everything = allocate(sens, base, L, build, 4096, 99.0)  # positive gains only, however large the budget
    assert everything.layer_key_heads == ((0, 1), (1,), (0, 1), (1,), (0,), (0, 1))


def test_key_head_allocations_per_window_and_their_record(build):
    """``allocation_codecs`` labels a per-head allocation ``oscar-kh4xN``; its recipe carries ``layer_key_heads`` (a
    list per layer, every layer, and no per-layer bits), which the artifact validates and ``apply_recipe`` restores."""
    windows = {f"oscar s=0 r={r}": build(KVConfig("oscar", group_size=D, sink=0, recent=r, page_size=8)) for r in (64, 128)}
    sens = head_sens([[0.1 * (i + 1), 0.05 * (i + 1)] for i in range(L)])
    budget = windows["oscar s=0 r=128"].bpe(4096) + 0.2
    out = allocation_codecs(sens, windows, L, build, 4096, budget)
    assert len(out) == 2 and all(c.bpe(4096) <= budget for c in out.values())
    for label, codec in out.items():
        n = sum(map(len, codec.config.layer_key_heads))
        assert label == f"oscar-kh4x{n} s=0 r={codec.config.recent}" and n > 0
    label = next(k for k in out if k.endswith("r=64"))
    scores = {k: DevScore(0.1, 1.0, (0.1,)) for k in out}
    rec = recipe_record(label, scores, out, 4096, {"dev_samples": 1})
    heads = out[label].config.layer_key_heads
    assert rec["layer_key_heads"] == [list(h) for h in heads] and len(rec["layer_key_heads"]) == L
    assert "layer_key_bits" not in rec and all("layer_key_heads" in c for c in rec["candidates"])
    assert scores_of(rec).startswith("0.100")
    art = artifact()
    art.manifest["recipe"] = rec
    art.validate()
    kv = apply_recipe(KVConfig("oscar", group_size=D), art)
    assert kv.layer_key_heads == heads and kv.layer_key_bits == () and "(the artifact's recipe" in describe_recipe(kv, art)


def test_the_report_names_the_head():
    from oscarkv.eval.allocate import report

    lines = report(head_sens([[0.1, 0.3]]))
    assert "key-heads layer  0 head  1: gain +0.3000" in lines[0] and "head  0" in lines[1]


def test_the_search_allocates_key_heads_end_to_end(loaded, capsys):
    """``search_windows`` with ``allocate=("key-heads",)`` on a tiny model (forced protocol): one sensitivity per
    (layer, KV head) in the recipe, the allocations among the candidates, each recorded per layer."""
    from oscarkv.eval.objective import search_windows
    from tests.engine.conftest import make_artifact

    c = loaded.model.config
    n, heads = c.num_hidden_layers, c.num_key_value_heads
    art = make_artifact(c)
    art.manifest["recipe"] = {"sink": 0, "recent": 0, "page_size": 1}  # sensitivities where every token is stored
    cfg = RecipeSearchConfig(max_bpe=4.0, context=512, dev_samples=2, dev_context=256, sinks=(0,), recents=(0,),
                             protocol="forced", allocate=("key-heads",))
    recipe, scores = search_windows(loaded, art, cfg)
    assert [(s["layer"], s["head"]) for s in recipe["sensitivity"]] == [(i, h) for i in range(n) for h in range(heads)]
    assert "head  0:" in capsys.readouterr().out
    allocs = [cand for cand in recipe["candidates"] if "layer_key_heads" in cand]
    assert all(len(cand["layer_key_heads"]) == n and "layer_key_bits" not in cand for cand in allocs)
    assert allocs and len(allocs) == sum(k.startswith("oscar-kh4x") for k in scores)  # seeded: some head gains
