"""``eval --backend engine``: free-running through the engine beside the teacher-forced diagnostic, on the same samples."""

from __future__ import annotations

import io
import json

import torch

from oscarkv.config import EvalConfig, KVConfig
from oscarkv.eval.engine_backend import served
from oscarkv.eval.runner import evaluate
from tests.engine.conftest import D, make_artifact


def test_served_configurations():
    assert served(KVConfig("bf16")) and served(KVConfig("oscar")) and served(KVConfig("quarot"))
    assert not served(KVConfig("oscar").without_windows()) and not served(KVConfig("kivi"))
    # what EngineConfig refuses is not served: no recent window behind pages of 64, a sink of half a page
    assert not served(KVConfig("oscar", sink=64, recent=0)) and not served(KVConfig("oscar", sink=32, recent=32))
    assert served(KVConfig("oscar", sink=0, recent=64)) and served(KVConfig("oscar", sink=32, recent=32, page_size=32))
    assert served(KVConfig("oscar", sink=4, recent=0, page_size=1))


def test_both_protocols_on_the_same_samples(loaded):
    kv = KVConfig(sink=8, recent=16, page_size=8, group_size=D)
    cfg = EvalConfig(methods=("bf16", "oscar"), tasks=("niah_single",), contexts=(256,), samples=2,
                     haystacks=("eval", "gazetteer"), kv=kv)
    log = io.StringIO()
    records, meta = evaluate(loaded, cfg, {"": make_artifact(loaded.model.config)}, log, backend="engine")
    rows = [json.loads(line) for line in log.getvalue().splitlines()]
    count = lambda m, p: sum(r["method"] == m and r["protocol"] == p for r in rows)  # noqa: E731
    assert count("fp32", "free") == count("oscar+win", "free") == 4  # 2 samples x 2 haystacks
    assert count("oscar", "free") == 0 and count("oscar", "forced") == 4  # no windows: not served
    assert count("fp32", "forced") == count("oscar+win", "forced") == 4
    assert {r["haystack"] for r in rows} == {"eval", "gazetteer"} and all(r["place"] in ("window", "history") for r in rows)
    free = [r for r in rows if r["protocol"] == "free" and r["method"] == "oscar+win"]
    assert all(2.0 < r["bpe"] < 16.0 for r in free)  # a windowed INT2 sequence
    assert meta["served"] == ["fp32", "oscar+win"]  # bf16: labelled with the dtype it stores
    assert {(r["method"], r["protocol"]) for r in records} == {
        ("fp32", "free"), ("oscar+win", "free"), ("fp32", "forced"), ("oscar+win", "forced"), ("oscar", "forced")}


def test_progress_counts_every_run_as_it_ends(loaded, monkeypatch):
    """The bar's total is the runs evaluate makes (free runs of the served configurations, forced scores of
    every codec): it ends exactly full, and advances after each engine batch and each sample's forced
    scores (the demo's bar sat at 0 until a whole batch of free runs and every forced score was done)."""
    from oscarkv.eval import runner

    bars = []

    class Bar:  # tqdm's counting, recorded
        def __init__(self, total, **_):
            self.total, self.n, self.seen = total, 0, []
            bars.append(self)

        def update(self, k):
            self.n += k
            self.seen.append(self.n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(runner, "tqdm", Bar)
    kv = KVConfig(sink=8, recent=16, page_size=8, group_size=D)
    cfg = EvalConfig(methods=("bf16", "naive", "oscar"), tasks=("niah_single",), contexts=(256,), samples=2,
                     haystacks=("eval",), free=("bf16", "oscar"), bf16_on_engine=False, batch=2, kv=kv)
    evaluate(loaded, cfg, {"": make_artifact(loaded.model.config)}, io.StringIO(), backend="engine")
    (bar,) = bars
    # per sample: free runs of fp32 (on its prefill) and oscar+win (engine), forced scores of the 5 codecs
    # (fp32, naive and oscar with and without windows)
    assert bar.total == 2 * (2 + 5) and bar.n == bar.total
    assert bar.seen == [2, 7, 8, 13, 14]  # the engine's batch of 2, then per sample: 5 forced, 1 BF16 free


def test_bf16_free_running_on_the_hf_path_matches_the_engine(loaded):
    """BF16's free-running answer from the diagnostic's full-precision prefill is the engine's answer."""
    from oscarkv.eval import tasks as task_lib
    from oscarkv.eval.engine_backend import build_engines
    from oscarkv.eval.runner import build_codecs, greedy_full_precision, prefill

    cfg = EvalConfig(methods=("bf16",), tasks=("niah_single",), contexts=(256,), samples=2)
    engine = build_engines(loaded, build_codecs(loaded.model, cfg), cfg, None)["fp32"]  # the fp32 model's
    tok = loaded.tokenizer
    for s in task_lib.generate("niah_single", 256, 2, tok, seed=4, haystack="gazetteer"):
        doc_ids = tok(s.document, add_special_tokens=False).input_ids
        prompt = doc_ids + tok(s.question, add_special_tokens=False).input_ids
        out = engine_text(engine, prompt)
        assert greedy_full_precision(loaded, prefill(loaded.model, torch.tensor([doc_ids])), s, 12) == out


def engine_text(engine, prompt: list[int]) -> str:
    from oscarkv.engine.request import SamplingParams

    engine.add_request("t", prompt, SamplingParams(max_tokens=12, temperature=0))
    out = None
    while engine.has_unfinished():
        for o in engine.step():
            out = o
    return out.text


def test_batched_answers_equal_one_at_a_time(loaded):
    """Samples run as concurrent requests through one engine get the answers each gets alone."""
    from oscarkv.eval import tasks as task_lib
    from oscarkv.eval.engine_backend import build_engines, score_free
    from oscarkv.eval.runner import build_codecs

    kv = KVConfig(sink=8, recent=16, page_size=8, group_size=D)
    art = {"": make_artifact(loaded.model.config)}
    tok = loaded.tokenizer
    samples = task_lib.generate("niah_single", 384, 3, tok, seed=5, haystack="gazetteer")
    samples += task_lib.generate("niah_multivalue", 320, 2, tok, seed=5)  # other lengths and answer budgets
    prompts = [tok(s.document + s.question, add_special_tokens=False).input_ids for s in samples]
    lengths = [3 + 2 * i for i in range(len(samples))]
    for batch in (1, 3):
        cfg = EvalConfig(methods=("oscar",), windows=(True,), contexts=(384,), kv=kv, batch=batch)
        engine = build_engines(loaded, build_codecs(loaded.model, cfg, art), cfg, art)["oscar+win"]
        alone = [score_free(engine, [p], [s], [n])[0] for p, s, n in zip(prompts, samples, lengths)]
        together = score_free(engine, prompts, samples, lengths)
        assert together == alone and len({t for _, _, t in alone}) > 1


def test_an_artifacts_recipe_sets_its_windows(loaded):
    """With windows, a variant whose manifest holds a recipe gets the recipe's windows (as serve does)."""
    from oscarkv.eval.runner import build_codecs

    chosen = make_artifact(loaded.model.config)
    chosen.manifest["recipe"] = {"sink": 0, "recent": 24, "page_size": 8, "key_bits": 4}
    cfg = EvalConfig(methods=("oscar",), windows=(True, False), kv=KVConfig(sink=8, recent=16, page_size=8, group_size=D),
                     tasks=("niah_single",), contexts=(256,), samples=1)
    arts = {"": make_artifact(loaded.model.config), "choice": chosen}
    codecs = build_codecs(loaded.model, cfg, arts)
    tiers = {k: (c.config.sink, c.config.recent, c.config.key_bits) for k, c in codecs.items()}
    assert tiers == {"oscar+win": (8, 16, 2), "oscar:choice+win": (0, 24, 4), "oscar": (0, 0, 2), "oscar:choice": (0, 0, 2)}
    records, _ = evaluate(loaded, cfg, arts, backend="engine")  # the recipe's rung runs through the engine
    assert {r["method"] for r in records if r["protocol"] == "free"} == {"oscar+win", "oscar:choice+win"}


def test_a_context_at_the_models_length_runs(loaded):
    """A sample filling the model's positions (8K multi-needle prompts on the default model) leaves
    less than the answer plus EXTRA_TOKENS: the answer budget shrinks to the room left instead of the
    engine refusing the request; the answer itself always fits."""
    from copy import deepcopy

    from oscarkv.eval.engine_backend import EXTRA_TOKENS, answer_budget

    assert answer_budget(10, 100, None) == answer_budget(10, 100, 1000) == 10 + EXTRA_TOKENS
    assert answer_budget(10, 8180, 8192) == 12 and answer_budget(10, 8182, 8192) == 10
    short = deepcopy(loaded)
    short.model.config.max_position_embeddings = 512  # the context below: prompt + answer fit, no more
    cfg = EvalConfig(methods=("bf16",), tasks=("niah_multivalue",), contexts=(512,), samples=1, haystacks=("eval",),
                     kv=KVConfig(sink=8, recent=16, page_size=8, group_size=D), diagnostic=False)
    records, _ = evaluate(short, cfg, None, io.StringIO(), backend="engine")
    assert [r["protocol"] for r in records] == ["free"]
