"""Speculative decoding on a GPU: the Triton backend, CUDA graphs and bf16 weights. Verify rows run as one batch of
decode rows (another graph bucket than batch 1, so another rounding): greedy tokens equal those without speculation
up to a near-tie (``test_gpu_engine._compare_prefix``), and drafts are accepted."""

import pytest
import torch

from oscarkv.config import SpeculativeConfig
from tests.engine.conftest import make_artifact, make_engine, run, tiny_model
from tests.engine.test_gpu_engine import _compare_prefix
from tests.engine.test_speculative import GREEDY, copy_prompts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_greedy_equals_without_speculation_gpu(method):
    model = tiny_model().to("cuda", torch.bfloat16)
    art = make_artifact(model.config)
    spec = SpeculativeConfig("ngram", num_speculative_tokens=4, prompt_lookup_max=3, min_accepted_tokens=0.0)
    ps = copy_prompts()
    base = run(make_engine(model, method, art), ps + ps, GREEDY)
    engine = make_engine(model, method, art, speculative=spec)
    assert type(engine.runner.backend).__name__ == "TritonAttention" and engine.runner.graphs
    # at build: every bucket a verify step of one sequence with <= K drafts replays (rows, or one chunk where the
    # split-K kernel reads the layout: not this tiny model's, whose verify steps run as decode rows)
    ext = engine.runner.extend_graphs
    assert set(engine.runner.graphs.graphs) == {1, 2, 4, 6} and set(ext.graphs) == ({2, 4, 8} if ext.serves else set())
    outs = run(engine, ps + ps, GREEDY)
    _compare_prefix(base, outs, 0.25)
    # NOTE: one wave of requests, so no prefix hits here (the CPU test runs two waves and checks them)
    assert engine.spec.stats.accepted > 10
