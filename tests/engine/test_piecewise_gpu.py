"""Piecewise graphs on a GPU (``oscarkv.engine.piecewise``): the Triton backend, CUDA graphs cut at each layer's
attention, bf16 weights, the extend-graph GPU tests' tiny model (head_dim 64, pages of 16). A 1104-token document
served in chunks of 48 through the pieces (each over a longer prefix: BF16 window and INT2 history), then
follow-ups of 20 and 48 tokens: greedy tokens ≡ the eager engine's up to a near-tie
(``test_gpu_engine._compare_prefix``), one graph a layer and one more per bucket."""

import pytest
import torch

from oscarkv.config import KVConfig
from oscarkv.bench.e2e import random_artifact
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.runner_build import mixed_bucket
from oscarkv.engine.request import SamplingParams
from tests.engine.conftest import engine_config, prompts, run
from tests.engine.test_extend_graphs_gpu import DOC, model  # noqa: F401 (a fixture)
from tests.engine.test_gpu_engine import _compare_prefix

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
FOLLOW = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=True)


def _engine(model, method, pieces: bool) -> LLMEngine:  # noqa: F811
    kv = KVConfig(method, group_size=64 if method != "bf16" else None, sink=16, recent=32, page_size=16)
    cfg = engine_config(method, kv=kv, kv_memory_bytes=1 << 24, prefill_chunk=48, extend_graph_buckets=(),
                        piecewise_graph_buckets=(32, 48) if pieces else ())
    return LLMEngine.from_hf(model, cfg, random_artifact(model.config) if method == "oscar" else None)


def _session(engine) -> list:
    doc = prompts(1, DOC, seed=3)[0]
    first = run(engine, [doc], FOLLOW)[0]
    return [first] + [run(engine, [doc + prompts(1, k, seed=10 + k)[0]], FOLLOW)[0] for k in (20, 48)]


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_chunks_and_followups_through_pieces_match_eager_gpu(model, method):  # noqa: F811
    eager = _session(_engine(model, method, False))
    engine = _engine(model, method, True)
    got = _session(engine)
    pw = engine.runner.piecewise
    assert pw is not None and pw.replays >= DOC // 48 + 2, (pw.replays, pw.fallbacks)
    layers = len(engine.runner.model.model.layers)
    buckets = (32, 48, mixed_bucket(engine.cfg))  # the last: a chunk beside decoders (piecewise_batches)
    assert {kb: len(g.pieces.graphs) for kb, g in pw.graphs.items()} == {kb: layers + 1 for kb in buckets}
    _compare_prefix(eager, got, 0.1)


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_steps_of_several_sequences_through_pieces_gpu(model, method):  # noqa: F811
    """``EngineConfig.piecewise_batches`` on a GPU: three prompts whose chunks share steps (and one's chunk beside the
    others' decode tokens) through the captured pieces, attention with the step's tables: the eager engine's greedy
    tokens up to a near-tie."""
    def engine(batches: bool) -> LLMEngine:
        kv = KVConfig(method, group_size=64 if method != "bf16" else None, sink=16, recent=32, page_size=16)
        cfg = engine_config(method, kv=kv, kv_memory_bytes=1 << 24, prefill_chunk=48, max_num_batched_tokens=96,
                            extend_graph_buckets=(), piecewise_graph_buckets=(48, 96) if batches else (),
                            piecewise_batches=batches)
        return LLMEngine.from_hf(model, cfg, random_artifact(model.config) if method == "oscar" else None)

    ps = [prompts(1, n, seed=n)[0] for n in (400, 230, 90)]
    eager = run(engine(False), ps, FOLLOW)
    pieces = engine(True)
    got = run(pieces, ps, FOLLOW)
    assert pieces.runner.piecewise.batched >= 3, pieces.runner.piecewise.fallbacks
    _compare_prefix(eager, got, 0.1)
