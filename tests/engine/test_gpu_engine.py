"""The engine's decode route and its CUDA backend.

CPU: a backend that sends one-token steps to ``decode`` (the runner's decode view: prefix plus
the token just written) gives the tokens of the ``extend`` route. GPU: the Triton backend
(``oscarkv.attention.backends``) gives the greedy tokens of the PyTorch-oracle backend on
the same bfloat16 model up to a near-tie (log-probs within 0.25 = four bf16 ulps of a logit near 10, up to and
including the first divergence), and
CUDA-graph decode ≡ eager decode (same tokens, log-probs within 0.01). The graphs' staged page
tables (``cuda_graphs.StagedTable``) hold every row's current list and upload only what changed."""

from dataclasses import replace

import pytest
import torch

from oscarkv.attention.backends import TorchAttention
from oscarkv.engine.cuda_graphs import StagedTable
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from oscarkv.quant.artifact import Artifact
from tests.engine.conftest import engine_config, prompts, run, tiny_model

CUDA = torch.cuda.is_available()


class _DecodeTorch(TorchAttention):
    decode_steps = True


def _engine(model, method, artifact, backend=None, cuda_graphs=True, bits=(2, 2)):
    cfg = engine_config(method, piecewise_graph_buckets=())  # decode graphs alone (test_piecewise_gpu: the pieces)
    cfg = replace(cfg, kv=replace(cfg.kv, key_bits=bits[0], value_bits=bits[1]))
    return LLMEngine.from_hf(model, cfg, artifact if method == "oscar" else None, backend=backend, cuda_graphs=cuda_graphs)


def _compare(a, b, lp_tol):
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < lp_tol


def _compare_prefix(a, b, lp_tol):
    """Greedy tokens equal up to a first divergence, which must be a near-tie: chosen-token log-probs
    within ``lp_tol`` at every step up to and including it (the two paths' top tokens there are about
    equally likely). NOTE: logits come out of a bf16 lm_head, so ties within one bf16 ulp are common."""
    for x, y in zip(a, b):
        n = next((i for i, (p, q) in enumerate(zip(x.token_ids, y.token_ids)) if p != q), len(x.token_ids) - 1)
        diffs = [round(abs(p - q), 4) for p, q in zip(x.logprobs[:n + 1], y.logprobs[:n + 1])]
        assert max(diffs) < lp_tol, (f"request {x.request_id}: first divergence at token {n}; log-prob differences "
                                     f"{diffs}; tokens {x.token_ids[:n + 2]} vs {y.token_ids[:n + 2]}; log-probs "
                                     f"{[round(p, 3) for p in x.logprobs[:n + 2]]} vs {[round(q, 3) for q in y.logprobs[:n + 2]]}")


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_decode_route_matches_extend_cpu(llama, artifact, method):
    ps = prompts(3, 37)  # crosses sink, window and history pages while decoding (page 8, window 16)
    ref = run(_engine(llama, method, artifact), ps)
    out = run(_engine(llama, method, artifact, _DecodeTorch()), ps)
    # kv=bf16 pools hold fp32 here: the routes differ by summation order only; INT2 methods also
    # by the BF16 rounding of the current token's own K/V.
    _compare(ref, out, 1e-4 if method == "bf16" else 2e-2)


@pytest.fixture(scope="module")
def cuda_model():
    return tiny_model().to("cuda", torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("method", ["bf16", "naive", "oscar", "oscar_keys_centered"])
def test_triton_engine_matches_oracle_gpu(cuda_model, artifact, method):
    """``oscar_keys_centered``: values uncentered (all-zero mean), as the recipe's artifacts: the decode
    step then stores fp32 rotated keys next to the bf16 values of the projection."""
    if method == "oscar_keys_centered":
        zero = torch.zeros_like(artifact.tensors["value.mean"])
        artifact = Artifact(artifact.manifest, {**artifact.tensors, "value.mean": zero})
        method = "oscar"
    ps = prompts(5, 61)  # batch 5: bucket 6 with a padding row
    triton_engine = _engine(cuda_model, method, artifact)
    assert type(triton_engine.runner.backend).__name__ == "TritonAttention" and triton_engine.runner.graphs
    out = run(triton_engine, ps)
    ref = run(_engine(cuda_model, method, artifact, TorchAttention()), ps)
    # NOTE: one bf16 ulp of a logit in [8, 16) is 0.0625: the tolerance is four such ulps (largest seen
    # on an H100, 2026-11-22: 0.163, oscar, 24 equal tokens).
    _compare_prefix(ref, out, 0.25)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("bits", [(4, 2), (2, 4), (4, 4)], ids=["k4v2", "k2v4", "int4"])
def test_triton_engine_rungs_match_oracle_gpu(cuda_model, artifact, bits):
    """The precision ladder through the Triton kernels and CUDA graphs ≡ the PyTorch oracles (same bound)."""
    ps = prompts(5, 61)
    out = run(_engine(cuda_model, "oscar", artifact, bits=bits), ps)
    ref = run(_engine(cuda_model, "oscar", artifact, TorchAttention(), bits=bits), ps)
    _compare_prefix(ref, out, 0.25)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_cuda_graph_matches_eager_gpu(cuda_model, artifact, method):
    ps = prompts(3, 50)
    graph = _engine(cuda_model, method, artifact)
    out = run(graph, ps)
    assert graph.runner.graphs.graphs, "no decode step replayed a graph"
    ref = run(_engine(cuda_model, method, artifact, cuda_graphs=False), ps)
    _compare(ref, out, 1e-2)  # buckets pad the batch, which changes the decode split count only


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_overlap_matches_sequential_gpu(cuda_model, artifact, method):
    """Steps launched ahead (the token ids read on the device, CUDA graphs) give the tokens and log-probs
    of steps run one after the other, greedy or drawn: exactly while no request stops early (the same batches run);
    with a stop token, up to a near-tie (the stopped request's row is kept in one step ahead, so the
    others may run in a larger bucket, with another decode split count)."""
    ps = prompts(3, 50)
    params = [SamplingParams(max_tokens=8 + 6 * i, temperature=0, logprobs=True, ignore_eos=True) for i in range(3)]
    engines = [LLMEngine.from_hf(cuda_model, engine_config(method, overlap=o), artifact if method == "oscar" else None)
               for o in (False, True)]
    ref, out = (run(e, ps, params) for e in engines)
    assert engines[1].num_ahead_steps > 10 and engines[0].num_ahead_steps == 0
    _compare(ref, out, 1e-9)
    stop = [SamplingParams(max_tokens=20, temperature=0, logprobs=True, ignore_eos=True,
                           stop_token_ids=(ref[1].token_ids[4],) if i == 1 else ()) for i in range(3)]
    ref, out = (run(e, ps, stop) for e in engines)
    assert ref[1].finish_reason == "stop" and len(ref[1].token_ids) <= 5
    _compare_prefix(ref, out, 0.25)
    drawn = [SamplingParams(max_tokens=8 + 6 * i, temperature=0.8, top_k=20, seed=i, logprobs=True, ignore_eos=True)
             for i in range(3)]  # each request's generator on the GPU: drawn there, steps still launched ahead
    ahead = engines[1].num_ahead_steps
    ref, out = (run(e, ps, drawn) for e in engines)
    assert engines[1].num_ahead_steps > ahead + 10
    _compare(ref, out, 1e-9)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or torch.cuda.get_device_capability()[0] < 9, reason="needs CUDA, compute capability 9.0+")
@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_l2_prefetch_keeps_outputs_gpu(cuda_model, artifact, method):
    """``EngineConfig.l2_prefetch``: the prefetch kernel runs (eager and inside the decode graphs) and changes
    nothing: the same tokens and log-probs as without it."""
    ps = prompts(3, 50)
    engines = [LLMEngine.from_hf(cuda_model, engine_config(method, l2_prefetch=v, l2_prefetch_mib=1, piecewise_graph_buckets=()),
                                 artifact if method == "oscar" else None) for v in ("off", "all")]
    layers = engines[1].runner.model.model.layers
    assert all("l2_next" in layer.self_attn.qkv_proj.__dict__ for layer in layers)
    ref, out = (run(e, ps) for e in engines)
    assert engines[1].runner.graphs.graphs
    _compare(ref, out, 1e-9)


def test_staged_table_uploads_changed_tails():
    dev = torch.device("cuda" if CUDA else "cpu")
    t = StagedTable(3, 40, dev)
    g = torch.Generator().manual_seed(0)
    rows = [[], [], []]
    for step in range(60):
        i = step % 3
        kind = torch.randint(0, 4, (1,), generator=g).item()
        if kind < 2:  # append a page (the usual decode change) or nothing
            rows[i] = rows[i] + torch.randint(1, 99, (kind,), generator=g).tolist()
        elif kind == 2:  # the window shifts: a different list of the same length
            rows[i] = torch.randint(1, 99, (len(rows[i]),), generator=g).tolist()
        else:  # another sequence takes the row
            rows[i] = torch.randint(1, 99, (torch.randint(0, 40, (1,), generator=g).item(),), generator=g).tolist()
        before = t.uploads
        t.set_row(i, list(rows[i]))
        if kind == 0:
            assert t.uploads == before, "uploaded an unchanged row"
        if dev.type == "cuda":
            torch.cuda.synchronize()
        for r, want in enumerate(rows):
            assert t.device_table[r, :len(want)].tolist() == want
