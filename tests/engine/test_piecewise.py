"""Piecewise graphs of long extend steps (``oscarkv.engine.piecewise``) on the CPU: nothing is captured there, each
replay runs the forward over the bucket's static, padded buffers, so the staging, the padding and the demotions
(prefix pages before, the step's own pages after) are what a GPU runs. Prompt chunks and follow-ups through the
pieces ≡ eager (tokens equal, log-probs within the CPU's batch-shape rounding), and the pools after equal; what the
pieces leave to eager steps, by name. The capture (pieces cut at each layer's attention): ``test_piecewise_gpu.py``."""

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from oscarkv.config import EngineConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.piecewise import PiecewiseGraphs, _Layer, _Pieces
from oscarkv.engine.request import SamplingParams
from tests.engine.conftest import engine_config, prompts, run, tiny_model
from tests.engine.test_gpu_engine import _DecodeTorch

BUCKETS = (16, 48)
FOLLOW = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=True)


def _engine(model, method, artifact, pieces: bool) -> LLMEngine:
    engine = LLMEngine.from_hf(model, engine_config(method, prefill_chunk=40), artifact if method == "oscar" else None,
                               backend=_DecodeTorch())
    if pieces:
        engine.runner.piecewise = PiecewiseGraphs(engine.runner, BUCKETS)
    return engine


def _pools(engine) -> list[torch.Tensor]:
    """The BF16 K and V pools, then every INT2 tensor (codes, scales, zeros) if any."""
    p = engine.runner.pools
    int2 = [getattr(pages, f) for pages in (p.int2_k, p.int2_v) if pages is not None for f in ("codes", "scale", "zero")]
    return [p.bf16_k, p.bf16_v, *int2]


def _session(engine) -> list:
    """A 70-token document (chunks of 40 and 30, demoting pages of the prefix and of their own), then follow-ups of
    9, 30 and 55 tokens (buckets 16 and 48; the last in two chunks, resumed at the document's end)."""
    doc = prompts(1, 70, seed=3)[0]
    run(engine, [doc], SamplingParams(max_tokens=1, ignore_eos=True))
    return [run(engine, [doc + prompts(1, k, seed=10 + k)[0]], FOLLOW)[0] for k in (9, 30, 55)]


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_long_chunks_through_pieces_match_eager(llama, artifact, method):
    eager_engine, engine = _engine(llama, method, artifact, False), _engine(llama, method, artifact, True)
    eager, got = _session(eager_engine), _session(engine)
    pw = engine.runner.piecewise
    assert set(pw.graphs) == {16, 48} and pw.replays >= 5, (pw.replays, pw.fallbacks)
    for a, b in zip(eager, got):
        assert a.token_ids == b.token_ids
        assert max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs)) < 1e-4
    _same_pools(eager_engine, engine)
    assert engine.runner.pools.geo.page_size == 8


def _same_pools(eager_engine, engine) -> None:
    for e, g in zip(_pools(eager_engine), _pools(engine)):
        if e.dtype == torch.uint8:  # INT2 codes: a value at a rounding boundary may take the next code
            assert (e == g).float().mean() > 0.999
        elif e.dim() == 5:  # BF16 pools [L, pages, H, P, d]: all but the scratch page 0 (padding rows write it)
            torch.testing.assert_close(e[:, 1:].float(), g[:, 1:].float(), rtol=0, atol=1e-2 * e.abs().max().item())
        else:
            torch.testing.assert_close(e.float(), g.float(), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_steps_of_several_sequences_through_pieces_match_eager(llama, artifact, method):
    """``EngineConfig.piecewise_batches``: steps of several sequences (three prompts' chunks together, then one's
    chunk beside the others' decode tokens) replay the pieces, attention with the step's tables: tokens, log-probs
    and the stored pages are the eager engine's."""
    def engine(pieces: bool) -> LLMEngine:
        cfg = engine_config(method, prefill_chunk=24, max_num_batched_tokens=48, piecewise_graph_buckets=(),
                            piecewise_batches=pieces)
        e = LLMEngine.from_hf(llama, cfg, artifact if method == "oscar" else None, backend=_DecodeTorch())
        if pieces:
            e.runner.piecewise = PiecewiseGraphs(e.runner, BUCKETS, batches=True)
        return e

    ps = [prompts(1, n, seed=n)[0] for n in (70, 45, 20)]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=True)
    eager_engine, pieces_engine = engine(False), engine(True)
    eager, got = run(eager_engine, ps, params), run(pieces_engine, ps, params)
    pw = pieces_engine.runner.piecewise
    assert pw.batched >= 3, (pw.replays, pw.batched, pw.fallbacks)
    for a, b in zip(eager, got):
        assert a.token_ids == b.token_ids
        assert max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs)) < 1e-4
    _same_pools(eager_engine, pieces_engine)


def test_what_the_pieces_leave_to_eager_steps(llama, artifact):
    engine = _engine(llama, "oscar", artifact, True)
    pw, plan = engine.runner.piecewise, (lambda k: SimpleNamespace(t0=0, t1=k))
    assert pw.reason([plan(40)]) is None and pw.reason([plan(2)]) is None
    assert pw.reason([plan(40), plan(1)]) == "sequences"
    batches = PiecewiseGraphs(engine.runner, BUCKETS, batches=True)  # EngineConfig.piecewise_batches
    assert batches.reason([plan(40), plan(1)]) is None and batches.reason([plan(40), plan(9)]) == "tokens"
    assert pw.reason([plan(1)]) == pw.reason([plan(49)]) == "tokens"
    gemma = LLMEngine.from_hf(tiny_model("Gemma3ForCausalLM"), engine_config("bf16"), backend=_DecodeTorch())
    assert PiecewiseGraphs(gemma.runner, BUCKETS).reason([plan(40)]) == "sliding"


def test_a_served_mixed_step_has_a_bucket():
    """A prompt chunk beside the other requests' decode tokens is one bucket's worth (the GPU's served mix: every
    such step was 513 tokens, over the 512 bucket, and ran eagerly)."""
    from oscarkv.engine.runner_build import mixed_bucket

    assert mixed_bucket(EngineConfig()) == 576  # 512 + 32 decoders
    assert mixed_bucket(EngineConfig(max_num_seqs=8, max_num_batched_tokens=520)) == 576
    assert mixed_bucket(EngineConfig(max_num_seqs=64, max_num_batched_tokens=4096)) == 576
    assert mixed_bucket(EngineConfig(max_num_seqs=256, max_num_batched_tokens=4096)) == 768
    assert mixed_bucket(EngineConfig(max_num_seqs=1, max_num_batched_tokens=513)) == 576


def test_the_mixed_bucket_only_for_chunks_the_buckets_hold():
    """``piece_buckets``: the defaults with CUDA graphs, plus the mixed bucket; chunks longer than every bucket add
    none (an 8192-token chunk's would hold GiBs of buffers); explicit buckets keep theirs; no graphs, none."""
    from oscarkv.engine.runner_build import piece_buckets

    assert piece_buckets(EngineConfig(), True) == (64, 128, 256, 512, 576)
    assert piece_buckets(EngineConfig(prefill_chunk=8192, max_num_batched_tokens=8224), True) == (64, 128, 256, 512)
    assert piece_buckets(EngineConfig(prefill_chunk=64, piecewise_graph_buckets=(32, 64)), False) == (32, 64, 128)
    assert piece_buckets(EngineConfig(piecewise_batches=False), True) == (64, 128, 256, 512)
    assert piece_buckets(EngineConfig(), False) == ()


def test_capture_all_builds_every_bucket_and_says_so(llama, artifact, caplog):
    engine = _engine(llama, "oscar", artifact, True)
    with caplog.at_level("INFO", logger="oscarkv.engine.piecewise"):
        engine.runner.piecewise.capture_all()
    assert set(engine.runner.piecewise.graphs) == set(BUCKETS)
    assert f"buckets {BUCKETS}, 0 graphs" in caplog.text  # no CUDA: eager over the buckets' buffers


def test_each_of_q_k_v_has_its_own_static_buffer():
    """A piece ends with q, k, v copied into static buffers: k and v of one shape and dtype (a BF16 cache) must not
    share one (the GPU test caught it: v overwrote k). The cut without capture (begin / end do nothing)."""
    q, k, v = torch.randn(8, 4, 16), torch.randn(8, 2, 16), torch.randn(8, 2, 16)
    shapes = {(i, tuple(x.shape), x.dtype) for i, x in enumerate((q, k, v))}
    pieces = _Pieces(None, shapes, (8, 4, 16), torch.device("cpu"))
    pieces.begin = pieces.end = lambda: None
    layer, seen = _Layer(None, 1.0), []
    pieces.cut((q, k, v), layer, lambda *qkv: seen.append([x.clone() for x in qkv]) or qkv[0])
    for got, want in zip(seen[0], (q, k, v)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len({x.data_ptr() for x in layer.qkv}) == 3


def test_buckets_are_token_counts():
    with pytest.raises(ValueError, match="piecewise_graph_buckets"):
        EngineConfig(piecewise_graph_buckets=(1, 512))
    assert EngineConfig().piecewise_graph_buckets is None  # PIECEWISE_BUCKETS with CUDA graphs, else off
    with pytest.raises(ValueError, match="l2_prefetch"):
        EngineConfig(piecewise_graph_buckets=(512,), l2_prefetch="all")


def test_tensor_parallel_ranks_run_the_pieces_alike(llama, artifact):
    """Two gloo ranks, each with the buckets (``build_runner`` on every rank, captured at start-up: the ``CAPTURE``
    message), against one eager process: the session's tokens equal, log-probs within the ranks' partial-sum order
    and the padding's rounding."""
    from oscarkv.engine.runner_build import piece_buckets
    from oscarkv.llm import LLM
    from oscarkv.models.loader import LoadedModel

    cfg = engine_config("oscar", prefill_chunk=40)
    eager = _session(LLMEngine.from_hf(llama, cfg, artifact))  # the default backends, as the ranks'
    two = LLM(LoadedModel(llama, None, "tiny"), "oscar", artifact=artifact, tensor_parallel_size=2,
              config=replace(cfg, piecewise_graph_buckets=BUCKETS)).engine
    try:
        assert tuple(two.runner.local.piecewise.graphs) == piece_buckets(two.cfg, False)  # at start-up (all ranks)
        got = _session(two)
        assert two.runner.local.piecewise.replays >= 5  # rank 0's (workers.ParallelRunner)
    finally:
        two.close()
    for a, b in zip(eager, got):
        assert a.token_ids == b.token_ids
        assert max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs)) < 1e-3


def test_a_tensor_parallel_capture_that_fails_stops_the_workers(llama, artifact, monkeypatch):
    """Rank 0's start-up capture raising (``ParallelRunner._capture_pieces``): the engine is not built, its error
    says so, and no worker is left running."""
    from oscarkv.engine.workers import ParallelRunner
    from oscarkv.llm import LLM
    from oscarkv.models.loader import LoadedModel

    def broken(self) -> None:
        raise RuntimeError("capture failed")

    started = []
    monkeypatch.setattr(PiecewiseGraphs, "capture_all", broken)
    monkeypatch.setattr(ParallelRunner, "_teardown", lambda self, t=ParallelRunner._teardown: started.extend(
        self.procs) or t(self))
    cfg = replace(engine_config("oscar", prefill_chunk=40), piecewise_graph_buckets=BUCKETS)
    with pytest.raises(RuntimeError, match="capture failed"):
        LLM(LoadedModel(llama, None, "tiny"), "oscar", artifact=artifact, tensor_parallel_size=2, config=cfg)
    assert started and not any(p.is_alive() for p in started)
