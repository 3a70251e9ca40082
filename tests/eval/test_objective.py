"""The development objective, the window search and the manifest recipe its users apply."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from oscarkv.config import EngineConfig, KVConfig, RecipeSearchConfig
from oscarkv.eval.objective import DevScore, choose, dev_samples, dev_scores, search_windows, spearman, window_codecs
from oscarkv.quant.artifact import apply_recipe, describe_recipe
from tests.engine.conftest import make_artifact


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833)  # ties share a rank


def test_dev_samples_use_the_calibration_haystack_and_other_seeds(loaded):
    s = dev_samples(loaded.tokenizer, 512, 5, seeds=(1000, 1001))
    assert [x.seed for x in s] == [1000, 1000, 1000, 1001, 1001] and {x.haystack for x in s} == {"calibration"}


def test_search_respects_the_budget_and_writes_every_candidate(loaded):
    art = make_artifact(loaded.model.config)
    cfg = RecipeSearchConfig(max_bpe=4.0, context=512, dev_samples=2, dev_context=256, sinks=(0, 4, 8),
                             recents=(0, 16, 256))
    codecs = window_codecs(loaded, art, 512, cfg.max_bpe, KVConfig(page_size=8), cfg.sinks, cfg.recents)
    assert codecs and all(c.bpe(512) <= 4.0 for c in codecs.values()) and "oscar s=8 r=256" not in codecs
    assert not any(k.startswith("oscar s=4 ") for k in codecs)  # not whole pages: not served
    assert "oscar s=0 r=0" in codecs and "oscar s=8 r=0" not in codecs  # a sink without a recent page: not served
    recipe, scores = search_windows(loaded, art, replace(cfg, protocol="forced"))
    assert recipe["bpe"] <= 4.0 and {"bf16"} < set(scores)
    assert len(recipe["candidates"]) == len(scores) - 1 and recipe["dev_samples"] == 2
    best = min(recipe["candidates"], key=lambda c: round(c["answer_nll"], 3))
    assert round(best["answer_nll"], 3) == round(min(c["answer_nll"] for c in recipe["candidates"]), 3)
    json.dumps(recipe)  # goes into the manifest as is


def test_page_sizes_are_candidates_with_their_own_windows(loaded):
    """``--pages``: each page size with every sink of whole pages and every recent window; a page size other than
    the base's is named (``p=4``) and carried in the candidate's config, the search's recipe records it."""
    art = make_artifact(loaded.model.config)
    codecs = window_codecs(loaded, art, 512, None, KVConfig(page_size=8), (0, 4, 8), (4, 16), pages=(8, 4))
    assert {"oscar s=4 r=4 p=4", "oscar s=8 r=16 p=4", "oscar s=0 r=4"} <= set(codecs)
    assert not any(k.startswith("oscar s=4 ") and not k.endswith("p=4") for k in codecs)  # 4 is no page of 8
    assert codecs["oscar s=4 r=4 p=4"].config.page_size == 4 and codecs["oscar s=0 r=4"].config.page_size == 8
    cfg = RecipeSearchConfig(max_bpe=None, context=512, dev_samples=1, dev_context=256, sinks=(4,), recents=(4,),
                             pages=(4,), tolerance=0.5, protocol="forced",
                             dev_seeds=(1000,))
    recipe, _ = search_windows(loaded, art, cfg)
    assert (recipe["sink"], recipe["recent"], recipe["page_size"]) == (4, 4, 4)
    assert recipe["candidates"][0]["page_size"] == 4


def test_served_protocol_reads_earlier_chunks_as_stored(loaded):
    """Through the engine's chunked prefill: an unquantized cache scores as the shared full-precision
    prefill does; a prompt within one chunk is computed at full precision whatever the storage;
    across 512-token chunks the later ones read the earlier ones as stored, and scores move."""
    from oscarkv.quant.bpe import SlidingLayers
    from oscarkv.quant.codec import build_codec

    art = make_artifact(loaded.model.config)
    c = loaded.model.config
    dims = (c.num_hidden_layers, c.num_key_value_heads, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    g = art.manifest["group_size"]
    codecs = {"bf16": build_codec(KVConfig("bf16"), *dims),
              "w": build_codec(KVConfig("oscar", sink=8, recent=8, page_size=8, group_size=g), *dims, art,
                               SlidingLayers.from_config(c)),
              "unserved": build_codec(KVConfig("oscar", group_size=g).without_windows(), *dims, art)}
    arts = {"w": art, "unserved": art}
    for context, chunks in ((300, 1), (1100, 3)):
        samples = dev_samples(loaded.tokenizer, context, 2)
        forced = dev_scores(loaded, codecs, samples, protocol="forced")
        served = dev_scores(loaded, codecs, samples, protocol="served", artifacts=arts, batch=2)
        assert set(served) == {"bf16", "w"}  # no windows: not served, not scored
        assert served["bf16"].per_sample == pytest.approx(forced["bf16"].per_sample, abs=1e-4)
        if chunks == 1:
            assert served["w"].per_sample == pytest.approx(served["bf16"].per_sample, abs=1e-4)
        else:
            assert served["w"].per_sample != pytest.approx(served["bf16"].per_sample, abs=1e-3)
            assert served["w"].per_sample != pytest.approx(forced["w"].per_sample, abs=1e-3)
    with pytest.raises(ValueError, match="protocol"):
        dev_scores(loaded, codecs, samples, protocol="chunked")
    with pytest.raises(ValueError, match="protocol"):
        RecipeSearchConfig(protocol="chunked")


def test_served_search_leaves_unserved_candidates_out(loaded):
    art = make_artifact(loaded.model.config)
    cfg = RecipeSearchConfig(max_bpe=8.0, context=1024, dev_samples=2, dev_context=256, sinks=(0, 64), recents=(0, 64))
    recipe, scores = search_windows(loaded, art, cfg)
    assert recipe["protocol"] == "served" and "oscar s=0 r=0" not in scores and "oscar s=64 r=64" in scores
    assert {(c["sink"], c["recent"]) for c in recipe["candidates"]} == {(0, 64), (64, 64)}


def test_choose_with_a_tolerance_takes_the_cheapest_that_holds():
    from oscarkv.quant.codec import build_codec

    codecs = {k: build_codec(KVConfig("naive", sink=s, recent=r, page_size=8), 2, 2, 32)
              for k, (s, r) in {"small": (0, 8), "mid": (8, 16), "big": (8, 64)}.items()}
    scores = {"small": DevScore(1.0, 0.5, ()), "mid": DevScore(0.6, 0.9, ()), "big": DevScore(0.5, 1.0, ())}
    ref = DevScore(0.4, 1.0, ())
    assert choose(scores, codecs, 256) == "big"
    assert choose(scores, codecs, 256, ref, tolerance=0.15) == "mid"
    assert choose(scores, codecs, 256, ref, tolerance=0.0) == "big"


def test_the_manifest_recipe_sets_the_windows_unless_the_caller_does(llama_artifact):
    from oscarkv.llm import LLM
    from oscarkv.models.loader import LoadedModel

    model, art = llama_artifact
    art.manifest["recipe"] = {"sink": 8, "recent": 24, "page_size": 8, "bpe": 3.1, "context": 512,
                              "objective": "development NIAH answer NLL", "dev_samples": 2}
    kv = apply_recipe(KVConfig("oscar", group_size=32), art)
    assert (kv.sink, kv.recent, kv.page_size) == (8, 24, 8)
    assert apply_recipe(KVConfig("naive"), art) == KVConfig("naive")
    loaded = LoadedModel(model, None, "tiny")
    llm = LLM(loaded, "oscar", artifact=art)
    assert (llm.engine.cfg.kv.sink, llm.engine.cfg.kv.recent) == (8, 24) and "the artifact's recipe" in llm.recipe
    mine = EngineConfig(KVConfig("oscar", sink=8, recent=8, page_size=8, group_size=32), kv_memory_bytes=1 << 22)
    llm = LLM(loaded, "oscar", artifact=art, config=mine)
    assert (llm.engine.cfg.kv.sink, llm.engine.cfg.kv.recent) == (8, 8) and "recipe but recent 8" in llm.recipe


def test_oscar_cache_from_artifact_uses_the_recipe(llama_artifact, tmp_path):
    from oscarkv.cache.hf_cache import OscarCache

    model, art = llama_artifact
    art.manifest["recipe"] = {"sink": 8, "recent": 24, "page_size": 8}
    art.save(tmp_path / "a")
    cache = OscarCache.from_artifact(model.config, tmp_path / "a")
    assert (cache.codec.config.sink, cache.codec.config.recent) == (8, 24)


@pytest.fixture
def llama_artifact():
    from tests.engine.conftest import tiny_model

    model = tiny_model()
    return model, make_artifact(model.config)


def test_calibrate_search_only_needs_a_budget(tmp_path, capsys):
    """``calibrate --rotations DIR`` only chooses a recipe: without --max-bpe or --tolerance it says so."""
    from oscarkv.cli.main import main

    assert main(["calibrate", "--rotations", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "--max-bpe" in capsys.readouterr().err


def test_a_key_clip_is_a_recipe_dimension_that_the_engine_serves(loaded):
    """``key_clips`` candidates replace every layer's fitted INT2 key clip (values and 4-bit keys keep
    theirs); the served search scores them through the engine, a chosen clip goes into the recipe,
    and an engine built from the recipe stores keys with it."""
    from oscarkv.engine.engine import LLMEngine

    art = make_artifact(loaded.model.config)
    codecs = window_codecs(loaded, art, 512, None, KVConfig(page_size=8), (8,), (16,), ("int2", "k4v2"), (0.95, 1.0))
    assert set(codecs) == {"oscar s=8 r=16", "oscar s=8 r=16 c=0.95", "oscar s=8 r=16 c=1", "oscar-k4v2 s=8 r=16"}
    fitted, clipped, off = (codecs[k].layers for k in ("oscar s=8 r=16", "oscar s=8 r=16 c=0.95", "oscar s=8 r=16 c=1"))
    assert all(c.key.clip == 0.95 and o.key.clip is None and c.value.clip == f.value.clip
               for f, c, o in zip(fitted, clipped, off))
    assert any(f.key.clip != 0.95 for f in fitted)  # the artifact's own ratios differ
    cfg = RecipeSearchConfig(max_bpe=8.0, context=1024, dev_samples=2, dev_context=256, sinks=(64,), recents=(64,),
                             key_clips=(0.95,))
    recipe, scores = search_windows(loaded, art, cfg)
    assert {"oscar s=64 r=64", "oscar s=64 r=64 c=0.95"} <= set(scores)
    assert sorted(c.get("key_clip") is not None for c in recipe["candidates"]) == [False, True]
    from oscarkv.eval.objective import scores_of

    picked = {**recipe, "key_clip": 0.95}
    clipped_score = next(c for c in recipe["candidates"] if c.get("key_clip") == 0.95)
    assert scores_of(picked) == f"{clipped_score['answer_nll']:.3f} (accuracy {100 * clipped_score['accuracy']:.0f}%)"
    art.manifest["recipe"] = picked
    kv = apply_recipe(KVConfig("oscar", group_size=art.manifest["group_size"]), art)
    assert kv.key_clip == 0.95 and "key clip 0.95 (the artifact's recipe" in describe_recipe(kv, art)
    engine = LLMEngine.from_hf(loaded.model, EngineConfig(kv, kv_memory_bytes=1 << 22), art)
    assert all(layer.key.clip == 0.95 for layer in engine.codec.layers)
    with pytest.raises(ValueError, match="key_clip applies to method 'oscar'"):
        KVConfig("naive", key_clip=0.9)
    with pytest.raises(ValueError, match="key_clips must lie in"):
        RecipeSearchConfig(key_clips=(1.5,))
    from oscarkv.cli.main import build_parser

    assert build_parser().parse_args(["calibrate", "--out", "x", "--key-clips", "0.95,1"]).key_clips == (0.95, 1.0)


def test_level_tables_are_a_recipe_dimension_that_the_engine_serves(loaded):
    """``levels`` candidates (``... lm``: the artifact's tables on the 2-bit kinds; none for INT4), a chosen
    ``lloyd_max`` recorded in the recipe, applied by its users, and an engine built from it reads its pages
    with the tables."""
    import torch

    from oscarkv.engine.engine import LLMEngine
    from oscarkv.eval.objective import recipe_record, scores_of

    art = make_artifact(loaded.model.config)
    table = (0.0, 0.875, 2.125, 3.0)
    art.tensors |= {f"{k}.levels": torch.tensor([table] * 2) for k in ("key", "value")}
    codecs = window_codecs(loaded, art, 512, None, KVConfig(page_size=8), (8,), (16,), ("int2", "int4"), (),
                           ("uniform", "lloyd_max"))
    assert set(codecs) == {"oscar s=8 r=16", "oscar s=8 r=16 lm", "oscar-int4 s=8 r=16"}
    assert all(c.key.levels == table == c.value.levels for c in codecs["oscar s=8 r=16 lm"].layers)
    scores = {k: DevScore(0.5 if k.endswith("lm") else 0.6, 1.0, ()) for k in codecs}
    recipe = recipe_record("oscar s=8 r=16 lm", scores, codecs, 512, {})
    assert recipe["levels"] == "lloyd_max" and scores_of(recipe).startswith("0.500")
    art.manifest["recipe"] = recipe
    kv = apply_recipe(KVConfig("oscar", group_size=art.manifest["group_size"]), art)
    assert kv.levels == "lloyd_max" and "lloyd_max levels (the artifact's recipe" in describe_recipe(kv, art)
    engine = LLMEngine.from_hf(loaded.model, EngineConfig(kv, kv_memory_bytes=1 << 22), art)
    assert engine.runner.pools.layer(1).int2_v.levels == table
    with pytest.raises(ValueError, match="RecipeSearchConfig.levels"):
        RecipeSearchConfig(levels=("cubic",))
