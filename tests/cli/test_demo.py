"""``oscarkv demo`` on the real default model (fp32 on the CPU): the configurations it compares, and the shipped
recipe served by the engine with per-layer pools.

The demo itself takes minutes, so these check what it is made of: the report labels and bits per element of the
codecs it builds (the frontier: unquantized, the uniform INT2 recipe, the shipped allocation, K4V2, each served
free-running), and the shipped artifact's recipe through the paged engine against the reference path
(``OscarCache``, ``tests/engine/test_allocation.py`` on a tiny model)."""

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def loaded():
    from oscarkv.models.loader import load_model

    return load_model("default", torch.float32)


@pytest.fixture(scope="module")
def shipped():
    from oscarkv.data import default_rotations_dir
    from oscarkv.quant.artifact import Artifact

    return Artifact.load(default_rotations_dir())


def test_demo_shows_the_frontier(loaded, shipped):
    """Four served points, the shipped one cheapest at 4K; without windows a recipe-only variant is no new row."""
    from oscarkv.calibrate.default import frontier_artifacts
    from oscarkv.cli.demo import demo_config, legend
    from oscarkv.cli.main import build_parser
    from oscarkv.eval.runner import _served, build_codecs

    cfg = demo_config(build_parser().parse_args(["demo"]))
    artifacts = frontier_artifacts(shipped)
    codecs = build_codecs(loaded.model, cfg, artifacts)
    frontier = ["fp32", "oscar:k4v2+win", "oscar:int2+win", "oscar+win"]
    assert set(frontier) <= set(_served(codecs, cfg, "engine"))
    assert {k for k in codecs if k.startswith("oscar")} == {"oscar", *frontier[1:]}
    bpe = [codecs[k].bpe(4096) if codecs[k].quantized else 32.0 for k in frontier]
    assert bpe == sorted(bpe, reverse=True) and bpe[-1] < 3.3 < bpe[-2] < 3.6 < bpe[1] < 4.5
    kv = {k: codecs[k].config for k in frontier[1:]}
    assert (kv["oscar:int2+win"].sink, kv["oscar:int2+win"].recent, kv["oscar:int2+win"].bits) == (64, 256, (2, 2))
    assert (kv["oscar:k4v2+win"].bits, kv["oscar:k4v2+win"].key_clip) == ((4, 2), None)
    assert sum(map(len, kv["oscar+win"].layer_key_heads)) == 42 and kv["oscar+win"].recent == 16
    assert legend(artifacts)[0].startswith("oscar+win: sink 16, recent 16, key bits 2, 4-bit keys in 42 KV heads")


def test_shipped_recipe_serves_with_per_head_pools(loaded, shipped):
    """The engine serving the shipped recipe keeps each layer's head ranges at their bits and generates what
    transformers generates with ``OscarCache`` storing the same recipe, past the windows into history."""
    from oscarkv.cache.hf_cache import OscarCache
    from oscarkv.config import EngineConfig, KVConfig
    from oscarkv.engine.engine import LLMEngine
    from oscarkv.engine.request import SamplingParams
    from oscarkv.quant.artifact import apply_recipe, describe_recipe
    from tests.engine.conftest import hf_greedy, run
    from tests.engine.test_equivalence import TOL_Q

    kv = apply_recipe(KVConfig("oscar", group_size=shipped.manifest["group_size"]), shipped)
    assert "(the artifact's recipe: 3.0176 bits per element at 8192 tokens" in describe_recipe(kv, shipped)
    engine = LLMEngine.from_hf(loaded.model, EngineConfig(kv, kv_memory_bytes=1 << 26, max_num_seqs=1), shipped,
                               loaded.tokenizer)
    geo = engine.runner.pools.geo
    assert [sum(p.hi - p.lo for p in parts if p.bits[0] == 4) for parts in geo.layer_parts] == list(
        map(len, kv.layer_key_heads))
    assert sum(len(parts) == 2 for parts in geo.layer_parts) == sum(0 < len(h) < 3 for h in kv.layer_key_heads)
    prompt = loaded.tokenizer(" ".join(f"Item {i} is {i * 7 % 100}." for i in range(40))).input_ids
    assert kv.sink + kv.recent + 2 * kv.page_size < len(prompt) <= 512  # history pages; one prefill chunk
    [out] = run(engine, [prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=True))
    toks, lps = hf_greedy(loaded.model, prompt, 8, OscarCache(loaded.config, kv, shipped))
    assert out.token_ids == toks
    assert max(abs(a - b) for a, b in zip(out.logprobs, lps)) < TOL_Q
