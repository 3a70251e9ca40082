"""Mistral and Qwen3-MoE against transformers on tiny random configs (no download).

For each: the paged model's logits equal transformers' on one dense forward; the engine with
``kv=bf16`` gives transformers' greedy tokens (DynamicCache) token for token; and ``kv=oscar`` runs
end to end with an artifact calibrated on the model itself, equal in tokens to transformers with
``OscarCache`` built from that artifact (the tolerance argument of tests/engine/test_equivalence.py).
"""


import pytest
import torch
from transformers import DynamicCache

from oscarkv.cache.hf_cache import OscarCache
from oscarkv.calibrate.run import calibrate
from oscarkv.config import CalibrationConfig
from oscarkv.models.llama import PagedLM
from oscarkv.models.loader import LoadedModel, ModelLoadError, check_config
from oscarkv.models.moe import SparseMoE
from tests.engine.conftest import engine_config, hf_greedy, make_engine, prompts, run, tiny_config, tiny_model
from tests.models.test_paged_llama import DenseStep

ARCHS = ["MistralForCausalLM", "Qwen3MoeForCausalLM"]
N = 16


class IdTokenizer:
    """Calibration text → token ids: one token per character (the tiny vocabulary)."""

    def __call__(self, text, add_special_tokens=False, verbose=False):
        return {"input_ids": [ord(ch) % 128 for ch in text]}


def calibrated(model):
    model.config._attn_implementation = "sdpa"
    art, _ = calibrate(LoadedModel(model, IdTokenizer(), "tiny"), CalibrationConfig(tokens=256, chunk=64, heldout_tokens=64))
    return art


@pytest.mark.parametrize("arch", ARCHS)
def test_dense_forward_matches_transformers(arch):
    hf = tiny_model(arch)
    ours = PagedLM.from_hf(hf)
    ids = torch.randint(0, 128, (13,))
    with torch.no_grad():
        got = ours.compute_logits(ours(ids, torch.arange(13), DenseStep([])))
        want = hf(ids[None]).logits[0]
    assert (got - want).abs().max() < 1e-4
    assert any(isinstance(layer.mlp, SparseMoE) for layer in ours.model.layers) == (arch == "Qwen3MoeForCausalLM")


@pytest.mark.parametrize("arch", ARCHS)
def test_engine_bf16_matches_transformers(arch):
    model = tiny_model(arch)
    ps = prompts(3, 30)
    outs = run(make_engine(model, "bf16"), ps)
    for p, out in zip(ps, outs):
        toks, lps = hf_greedy(model, p, N, DynamicCache(config=model.config))
        assert out.token_ids[:N] == toks
        assert max(abs(a - b) for a, b in zip(out.logprobs, lps)) < 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_engine_oscar_with_a_calibrated_artifact(arch):
    model = tiny_model(arch)
    art = calibrated(model)
    ps = prompts(2, 41)
    outs = run(make_engine(model, "oscar", art), ps)
    for p, out in zip(ps, outs):
        toks, _ = hf_greedy(model, p, N, OscarCache(model.config, engine_config().kv, art))
        assert out.token_ids[:N] == toks


def test_windowed_mistral_is_refused():
    with pytest.raises(ModelLoadError, match="sliding_window=64"):
        check_config(tiny_config("MistralForCausalLM", sliding_window=64, max_position_embeddings=4096), "test")


def test_a_mixture_of_experts_runs_without_cuda_graphs():
    """Qwen3-MoE's expert buffers are sized from the step's routing on the host (``int(counts.max())``), which a
    CUDA graph cannot capture: no decode graphs (and so no extend graphs, pieces or start-up builds) for it, while
    a dense model of the same backend gets them."""
    from types import SimpleNamespace

    from oscarkv.attention.backends import TritonAttention
    from oscarkv.engine.assembly import graph_buckets
    from oscarkv.engine.cuda_graphs import DEFAULT_BUCKETS

    dense = SimpleNamespace(sliding=None)
    assert graph_buckets(PagedLM.from_hf(tiny_model("Qwen3MoeForCausalLM")), dense, TritonAttention(), True) == ()
    assert graph_buckets(PagedLM.from_hf(tiny_model()), dense, TritonAttention(), True) == DEFAULT_BUCKETS
