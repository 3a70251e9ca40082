"""``oscarkv bench speculative`` on the CPU: the real-model part on a tiny model (counts that add up, tokens equal
to no speculation), the verify-step cost at a tiny shape (each step verifies 1 + K rows), and the projection."""

from __future__ import annotations

import pytest

from oscarkv.bench import speculative as sb
from oscarkv.bench.configs import SpeculativeBench
from oscarkv.config import KVConfig, SpeculativeConfig
from oscarkv.models.llama import PagedLM
from tests.bench.test_followup import CONFIG
from tests.engine.conftest import make_artifact, make_engine, prompts, tiny_model


@pytest.fixture(scope="module")
def rows():
    llama = tiny_model()
    artifact = make_artifact(llama.config)
    a, b = prompts(2, 10, seed=5)
    tasks = {"copy": a * 4 + b[:3], "no-copy": prompts(1, 45, seed=6)[0]}

    def make(method, k):
        spec = (SpeculativeConfig("ngram", num_speculative_tokens=k, prompt_lookup_max=3, min_accepted_tokens=0.0) if k
                else SpeculativeConfig())  # drafts at every match: counts every verify path
        return make_engine(llama, method, artifact, speculative=spec)
    return sb.task_rows(make, tasks, "oscar", (2, 4), max_tokens=20, repeats=2)


def test_model_rows_count_what_was_generated(rows):
    """Every K gives the tokens of K = 0; tokens after the first = decode steps + accepted drafts; at batch 1
    each engine step after the first token is one decode step of the request; the copy task accepts drafts. Each
    task ran twice on its engine (``repeats``): the median run is reported, both runs' ms per token beside it."""
    assert [(r["task"], r["k"]) for r in rows] == [(t, k) for k in (0, 2, 4) for t in ("copy", "no-copy")]
    for r in rows:
        st = r["spec"]
        assert r["tokens_equal"] and r["first_diff"] is None and r["drift"] < 1e-4 and r["ms_per_token"] > 0
        assert len(r["all_ms"]) == 2 and r["ms_per_token"] == max(r["all_ms"])  # the upper median of two runs
        if r["k"] == 0:
            assert st["drafted"] == 0 and r["tokens_per_step"] == 1.0 and r["decode_steps"] == 19
            continue
        assert st["decode_steps"] + st["accepted"] == 19 and r["decode_steps"] == st["decode_steps"]
        assert st["accepted"] <= st["drafted"] <= r["k"] * st["verify_steps"]
        assert r["tokens_per_step"] == pytest.approx(19 / st["decode_steps"])
    assert all(len(r["output"]) == 20 and r["output"] == rows[r["task"] == "no-copy"]["output"] for r in rows)
    copy4 = next(r for r in rows if r["task"] == "copy" and r["k"] == 4)
    assert copy4["acceptance_rate"] > 0 and copy4["tokens_per_step"] > 1
    assert "| oscar | copy | 4 |" in sb.model_table(rows)


def test_a_bench_json_replays_through_the_draft_gate_sim(rows, tmp_path, monkeypatch):
    """The JSON keeps the prompts and every row's tokens: ``draft_gate_sim`` replays the K = 0 outputs (as served)
    of each method and task (on the copy task, drafts are accepted: fewer steps than tokens)."""
    import importlib.util
    import json

    from pathlib import Path

    from oscarkv.bench import e2e

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # NOTE: the sim reads its gate before from a path of the repository
    spec = importlib.util.spec_from_file_location("draft_gate_sim", root / "lab/scripts/draft_gate_sim.py")
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    a, b = prompts(2, 10, seed=5)
    out = tmp_path / "spec.json"
    e2e.write_json(out, SpeculativeBench(), rows, prompts={"copy": a * 4 + b[:3], "no-copy": prompts(1, 45, seed=6)[0]})
    got = sim.tasks(str(out))
    assert sorted(got) == ["oscar-copy", "oscar-no-copy"] and len(got["oscar-copy"]["output"]) == 20
    r = sim.replay(sim.current, got["oscar-copy"]["prompt"], got["oscar-copy"]["output"], 4, (1.45, 1.05), True)
    assert r["verify"] >= 1 and r["steps"] < 19 and json.loads(out.read_text())["prompts"]["copy"][:3] == a[:3]


def test_model_engines_serve_the_artifacts_recipe():
    """The real-model part's OSCAR engines take the artifact's recipe, as ``LLM`` and ``serve`` do; BF16 none."""
    from types import SimpleNamespace

    llama = tiny_model()
    artifact = make_artifact(llama.config)
    artifact.manifest["recipe"] = dict(sink=0, recent=8, page_size=8, layer_key_heads=[[1], [0]])
    make = sb.model_engine_factory(SimpleNamespace(model=llama, tokenizer=None), artifact, kv_bytes=1 << 22)
    kv = make("oscar", 2).cfg.kv
    assert (kv.sink, kv.recent, kv.page_size, kv.layer_key_heads) == (0, 8, 8, ((1,), (0,)))
    assert make("bf16", 0).cfg.kv.layer_key_heads == ()
    over = sb.model_engine_factory(SimpleNamespace(model=llama, tokenizer=None), artifact, {"sink": 8}, kv_bytes=1 << 22)
    kv = over("oscar", 2).cfg.kv  # the bench's --sink 8: that window over the recipe, its heads kept
    assert (kv.sink, kv.recent, kv.page_size, kv.layer_key_heads) == (8, 8, 8, ((1,), (0,)))
    assert over("bf16", 0).cfg.kv.sink == KVConfig("bf16").sink
    gate = sb.model_engine_factory(SimpleNamespace(model=llama, tokenizer=None), artifact, kv_bytes=1 << 22,
                                   gate={"min_accepted_tokens": 1.5})
    assert gate("oscar", 2).cfg.speculative.min_accepted_tokens == 1.5 and not gate("oscar", 0).cfg.speculative.enabled


def test_bench_speculative_flags_set_fields_over_the_recipe():
    """``oscarkv bench speculative --sink 16 --key-bits 4``: the fields the engine's flags set, none by default."""
    import argparse

    from oscarkv.cli import bench
    from oscarkv.cli.flags import recipe_given

    p = argparse.ArgumentParser()
    bench.setup(p)
    assert recipe_given(p.parse_args(["speculative"])) == {}
    assert recipe_given(p.parse_args(["speculative", "--sink", "16", "--key-bits", "4"])) == {"sink": 16, "key_bits": 4}


def test_verify_cost_steps_verify_k_drafts():
    """At a tiny shape on the CPU: K = 0 steps run one row, K steps 1 + K rows (timed clear of a demotion)."""
    cfg = SpeculativeBench(methods=("oscar",), num_speculative_tokens=(3,), contexts=(700,), steps=6, kv_gib=1 / 64)
    got = sb.shape_rows(PagedLM.random(CONFIG), cfg, "tiny")
    assert [r["k"] for r in got] == [0, 3]
    assert got[0]["rows_per_step"] == 1.0 and got[1]["rows_per_step"] == 4.0
    assert all(r["step_us"] > 0 and r["decode_overlap_us"] > 0 for r in got)
    assert "| tiny | 700 | oscar | 3 |" in sb.shape_table(got)


def test_projection_weighs_verify_and_plain_steps():
    """All steps verify and accept one draft each: half a verify step per token; no verify step: a decode step."""
    cost = [dict(shape="s", context=8, method="oscar", k=k, step_us=us, decode_overlap_us=900.0)
            for k, us in ((0, 1000.0), (4, 3000.0))]
    spec = dict(decode_steps=10, verify_steps=10, drafted=40, accepted=10)
    model = [dict(method="oscar", task="copy", k=4, tokens_per_step=2.0, spec=spec),
             dict(method="oscar", task="no-copy", k=4, tokens_per_step=1.0, spec={**spec, "verify_steps": 0})]
    got = {p["task"]: p for p in sb.projection(model, cost)}
    assert got["copy"]["ms_per_token"] == pytest.approx(1.5) and got["copy"]["speedup"] == pytest.approx(0.6)
    assert got["no-copy"]["ms_per_token"] == pytest.approx(1.0)
    shrunk = [{**c, "rows_per_step": 3.0} if c["k"] == 4 else c for c in cost]  # steps cut short by a demotion
    assert sb.projection(model, shrunk) == []


def test_divergence_names_the_first_difference_and_its_margin():
    """Equal outputs: no position; else the first differing one, the drift of the log-probs before it, and K = 0's
    log-prob there minus the other run's (a near-tie: close to 0)."""
    ref = ([5, 6, 7, 8], [-0.1, -0.2, -0.69, -0.3])
    assert sb.divergence(ref, ref) == dict(first_diff=None, drift=0.0, margin=None)
    got = sb.divergence(ref, ([5, 6, 9, 1], [-0.1, -0.25, -0.70, -2.0]))
    assert got["first_diff"] == 2 and got["drift"] == pytest.approx(0.05) and got["margin"] == pytest.approx(0.01)


def test_verify_cost_is_timed_warm_through_the_graphs():
    """Every graph the timed steps replay is built before timing (``captured`` 0) and each verify step (one
    sequence, a backend with decode steps) runs as one chunk through an extend graph: the bench times verify
    steps as served. The CPU builds no CUDA graph; extend graphs are installed as ``tests/engine`` does."""
    from oscarkv.bench import e2e
    from oscarkv.config import EngineConfig, KVConfig
    from oscarkv.engine.assembly import build_runner_and_codec
    from oscarkv.engine.engine import LLMEngine
    from oscarkv.engine.extend_graphs import ExtendGraphs
    from tests.engine.test_gpu_engine import _DecodeTorch

    model = PagedLM.random(CONFIG)
    cfg = EngineConfig(KVConfig("oscar"), kv_memory_bytes=1 << 24, max_num_seqs=1, prefill_chunk=1024,
                       max_num_batched_tokens=1025, enable_prefix_caching=False,
                       speculative=SpeculativeConfig("ngram", num_speculative_tokens=3))
    runner, codec = build_runner_and_codec(model, cfg, e2e.random_artifact(model.config), backend=_DecodeTorch())
    runner.extend_graphs = ExtendGraphs(runner, (2, 4, 8))
    engine = LLMEngine(e2e.BenchRunner(runner), codec, cfg)
    got = sb.verify_cost(engine, 752, (3,), 6)  # a demotion at 768: plain steps first carry the K = 3 steps past it
    assert set(runner.extend_graphs.graphs) == {2, 4} and [r["captured"] for r in got] == [0, 0]
    assert got[1]["graph"] == 1.0 and got[1]["rows_per_step"] == 4.0 and runner.extend_graphs.replays >= 6
