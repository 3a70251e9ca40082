"""Extend graphs (``oscarkv.engine.extend_graphs``) on the CPU: nothing is captured there, each replay runs the
graph's forward over its static, padded buffers, so the staging, the padding and the routing are what a GPU
replays. Follow-up steps over a cached prefix through the graphs ≡ eager (tokens equal, log-probs within the
CPU's batch-shape rounding) for k in several buckets, padded or not; a padded step changes no stored byte but
its own slots (and the scratch page); speculative verify chunks through the graphs give the greedy tokens of a
run without speculation. GPU: ``test_extend_graphs_gpu.py``."""

import pytest
import torch

from oscarkv.config import SpeculativeConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.extend_graphs import ExtendGraphs
from oscarkv.engine.request import SamplingParams
from tests.engine.conftest import engine_config, prompts, run
from tests.engine.test_gpu_engine import _DecodeTorch
from tests.engine.test_speculative import GREEDY, copy_prompts

BUCKETS = (2, 4, 8)
FOLLOW = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=True)


def _engine(model, method, artifact, graphs: bool, backend=None, **kw) -> LLMEngine:
    kw = {"prefill_chunk": 40, **kw}  # chunks start at the document's end: a follow-up's prefix hit
    engine = LLMEngine.from_hf(model, engine_config(method, **kw), artifact if method == "oscar" else None,
                               backend=backend or _DecodeTorch())
    if graphs:  # a speculating engine's graphs form the greedy pair (as model_runner builds them)
        engine.runner.extend_graphs = ExtendGraphs(engine.runner, BUCKETS, greedy="speculative" in kw)
    return engine


def _followups(engine, ks) -> list:
    """A 40-token document served once (its pages cached), then one follow-up of k fresh tokens per k."""
    doc = prompts(1, 40, seed=3)[0]
    run(engine, [doc], SamplingParams(max_tokens=1, ignore_eos=True))
    asks = [doc + prompts(1, k, seed=10 + k)[0] for k in ks]
    return [run(engine, [a], FOLLOW)[0] for a in asks]


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_followups_through_graphs_match_eager(llama, artifact, method):
    ks = (2, 3, 5, 8, 12)  # 3 and 5 padded, 12 beyond the buckets (eager)
    eager = _followups(_engine(llama, method, artifact, False), ks)
    engine = _engine(llama, method, artifact, True)
    got = _followups(engine, ks)
    graphs = engine.runner.extend_graphs
    assert set(graphs.graphs) == {2, 4, 8} and graphs.replays == 4
    assert graphs.fallbacks["tokens"] >= 2  # the document's 40-token prefill, the 12-token follow-up
    for a, b in zip(eager, got):
        assert a.token_ids == b.token_ids
        assert max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs)) < 1e-4


def _pools(engine) -> list[torch.Tensor]:
    """The BF16 K and V pools, then every INT2 tensor (codes, scales, zeros), copied."""
    p = engine.runner.pools
    int2 = [getattr(pages, f) for pages in (p.int2_k, p.int2_v) for f in ("codes", "scale", "zero")]
    return [t.clone() for t in (p.bf16_k, p.bf16_v, *int2)]


def _flat(pool: torch.Tensor) -> torch.Tensor:
    """``[L, pages, H, P, d]`` -> ``[L, slots, H, d]`` (flat BF16 slots)."""
    L, _, H, _, d = pool.shape
    return pool.transpose(2, 3).reshape(L, -1, H, d)


def test_padded_rows_store_nothing(llama, artifact):
    """A 3-token follow-up in the bucket of 4: every pool byte outside its 3 slots and the scratch page 0 is
    unchanged, exactly; its 3 slots hold what the eager step stores (up to the CPU's batch-shape rounding)."""
    stored = []
    for graphs in (False, True):
        engine = _engine(llama, "oscar", artifact, graphs)
        doc = prompts(1, 40, seed=3)[0]
        run(engine, [doc], SamplingParams(max_tokens=1, ignore_eos=True))
        engine.add_request("f", doc + [5, 6, 7], SamplingParams(max_tokens=1, ignore_eos=True))
        seen = []
        real = engine.runner.forward
        engine.runner.forward = lambda plans, *a: (seen.append(plans[0]), real(plans, *a))[1]
        before = _pools(engine)
        engine.step()
        after, P = _pools(engine), engine.runner.pools.geo.page_size
        slots = seen[0].slots
        assert len(slots) == 3 and not seen[0].demote_src
        mask = torch.ones(before[0].shape[1] * P, dtype=torch.bool)  # flat BF16 slots
        mask[slots] = False
        mask[:P] = False  # the scratch page
        for b, a in zip(before[:2], after[:2]):
            assert torch.equal(_flat(b)[:, mask], _flat(a)[:, mask])
        for b, a in zip(before[2:], after[2:]):
            assert torch.equal(b, a)  # no INT2 page changes
        stored.append([_flat(t)[:, slots] for t in after[:2]])
        assert graphs == (engine.runner.extend_graphs is not None and engine.runner.extend_graphs.replays == 1)
    for e, g in zip(*stored):
        torch.testing.assert_close(e, g, rtol=0, atol=1e-2 * e.abs().max().item())


@pytest.mark.parametrize("method,tol", [("bf16", 1e-4), ("oscar", 2e-2)])
def test_speculative_verify_chunks_match_without(llama, artifact, method, tol):
    """Verify chunks alone in their step run as one chunk through the graphs (kv=bf16 pools hold fp32 here, so
    the chunk's own K/V are its rows' stored values; oscar: bf16 slots, the chunk's rows use them unrounded)."""
    spec = SpeculativeConfig("ngram", num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3, min_accepted_tokens=0.0)
    ps = copy_prompts()
    base = [run(_engine(llama, method, artifact, False), [p], GREEDY)[0] for p in ps]
    engine = _engine(llama, method, artifact, True, speculative=spec)
    pairs, accept = [], engine.spec.accept  # every verify step accepts from the pair its graph formed
    engine.spec.accept = lambda *a: (pairs.append(a[-1] is not None), accept(*a))[1]
    outs = [run(engine, [p], GREEDY)[0] for p in ps]
    st = engine.spec.stats
    assert st.accepted > 5 and engine.runner.extend_graphs.replays == st.verify_steps == st.graph_steps
    assert len(pairs) == st.verify_steps and all(pairs) and engine.runner.extend_graphs.take_greedy() is None
    for a, b in zip(base, outs):
        assert a.token_ids == b.token_ids
        assert max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs)) < tol


def test_verify_without_decode_steps_stays_rows(llama, artifact):
    """With a backend whose steps all go to ``extend`` (the CPU oracle) a verify chunk is not one chunk: its rows
    would see earlier drafts unrounded, a decode step as stored."""
    from oscarkv.attention.backends import TorchAttention

    engine = _engine(llama, "oscar", artifact, True, backend=TorchAttention(),
                     speculative=SpeculativeConfig("ngram", num_speculative_tokens=4, min_accepted_tokens=0.0))
    run(engine, copy_prompts()[:1], GREEDY)
    assert engine.spec.stats.verify_steps > 0 and engine.runner.extend_graphs.replays == 0


def test_verify_buckets_captured_before_steps(llama, artifact):
    """``capture_graphs(1 + K)`` builds every extend bucket a verify step of up to K drafts replays (shorter ones
    too: drafts run out, ``draft_end`` stops before a demotion); the steps after it build none, and every verify
    step is counted as a graph hit."""
    spec = SpeculativeConfig("ngram", num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3,
                             min_accepted_tokens=0.0)
    engine = _engine(llama, "oscar", artifact, True, speculative=spec)
    graphs = engine.runner.extend_graphs
    assert engine.runner.capture_graphs(5) == 3 and set(graphs.graphs) == {2, 4, 8}
    built = []
    graphs.capture = lambda n, real=graphs.capture: (built.append(graphs.bucket(n) not in graphs.graphs), real(n))[1]
    for p in copy_prompts():  # one at a time: a verify chunk is one chunk only alone in its step
        run(engine, [p], GREEDY)
    st = engine.spec.stats
    assert st.verify_steps > 5 and st.graph_steps == st.verify_steps == graphs.replays and not any(built)
    assert engine.runner.capture_graphs(5) == 0


@pytest.mark.parametrize("wrong", [True, False], ids=["all-rejected", "half-accepted"])
def test_verify_chunks_store_what_decode_steps_store(llama, artifact, wrong):
    """The GPU's route of a verify step (one chunk through an extend graph, alone in its step) over oscar pools
    whose recent window demotes during speculation: after every step, each stored length has the tiers of a run
    without speculation (no rejected draft pushed a page into INT2) and the same stored K/V — the BF16 slots up to
    the CPU's batch-shape rounding, every INT2 page byte for byte."""
    from tests.engine.test_speculative import _count_demoting_verify_steps, _snapshots

    p = prompts(1, 30, seed=7)[0]
    base = _snapshots(_engine(llama, "oscar", artifact, False), [p])
    truth = list(p) + run(_engine(llama, "oscar", artifact, False), [p], GREEDY)[0].token_ids

    def drafter(seq, limit):
        nxt = truth[len(seq.token_ids):len(seq.token_ids) + min(limit, 4)]
        keep = 0 if wrong else len(nxt) // 2
        return nxt[:keep] + [(t + 1) % 128 for t in nxt[keep:]]
    spec = SpeculativeConfig("ngram", num_speculative_tokens=4, min_accepted_tokens=0.0)
    engine = _engine(llama, "oscar", artifact, True, speculative=spec)
    demoting = _count_demoting_verify_steps(engine)
    got = _snapshots(engine, [p], drafter)
    st = engine.spec.stats
    assert st.graph_steps == st.verify_steps > 5 and demoting[0] >= 2 and (st.accepted == 0) == wrong
    common = got.keys() & base.keys()
    assert len(common) >= (len(base) if wrong else 8)
    for key in common:
        a, b = got[key], base[key]
        assert [t.shape for t in a] == [t.shape for t in b], key  # the same tiers at this length
        for x, y in zip(a[:2], b[:2]):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-2 * y.abs().max().item())  # a bf16 ulp
        assert all(torch.equal(x, y) for x, y in zip(a[2:], b[2:])), key


def test_speculation_adds_its_verify_bucket():
    """With n-gram speculation of K drafts the extend graphs gain a bucket of exactly 1 + K tokens (a full verify
    chunk is not padded to the next bucket) up to the largest; without speculation, or with extend graphs off,
    nothing changes."""
    from dataclasses import replace

    from oscarkv.config import EngineConfig
    from oscarkv.engine.runner_build import extend_buckets

    spec = SpeculativeConfig("ngram", num_speculative_tokens=8)
    assert extend_buckets(EngineConfig(speculative=spec)) == (2, 4, 8, 9, 16, 32, 64)
    assert extend_buckets(EngineConfig()) == EngineConfig().extend_graph_buckets
    assert extend_buckets(EngineConfig(speculative=spec, extend_graph_buckets=())) == ()
    assert extend_buckets(EngineConfig(speculative=replace(spec, num_speculative_tokens=7))) == (2, 4, 8, 16, 32, 64)
    assert extend_buckets(EngineConfig(speculative=replace(spec, num_speculative_tokens=99))) == (2, 4, 8, 16, 32, 64)


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_repeated_followups_replay_staged_graphs(llama, artifact, method):
    """Follow-ups longer than the short buckets over one cached document (staged buckets 16 and 64): the first of
    a (bucket, prefix lengths) runs eagerly, the second captures its graph, later ones replay it; the cold 40-token
    document fits a staged bucket but is no follow-up, so it never counts. Tokens and log-probs equal eager."""
    ks = (12, 12, 12, 20, 20)
    doc = prompts(1, 40, seed=3)[0]
    asks = [doc + prompts(1, k, seed=100 + i)[0] for i, k in enumerate(ks)]  # fresh tokens: the hit is the document
    outs = []
    for graphs in (False, True):
        engine = _engine(llama, method, artifact, graphs)
        if graphs:
            engine.runner.extend_graphs.staged_buckets = (16, 64)
        run(engine, [doc], SamplingParams(max_tokens=1, ignore_eos=True))
        outs.append([run(engine, [a], FOLLOW)[0] for a in asks])
    g = engine.runner.extend_graphs
    assert [key[0] for key in g.staged] == [16, 64]  # NOTE: OSCAR's tiers (the key's lengths) follow the chunk's end
    assert g.fallbacks["staged_first"] == 2 and g.replays == 3 and not g.sightings
    for a, b in zip(*outs):
        assert a.token_ids == b.token_ids
        assert max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs)) < 1e-4


def test_staged_graphs_keep_the_latest(llama, artifact, monkeypatch):
    """Beyond ``STAGED_GRAPHS`` the least recently replayed staged graph goes; its key then counts anew."""
    from oscarkv.engine import extend_graphs

    monkeypatch.setattr(extend_graphs, "STAGED_GRAPHS", 1)
    engine = _engine(llama, "bf16", artifact, True)
    g = engine.runner.extend_graphs
    g.staged_buckets = (16, 64)
    doc = prompts(1, 40, seed=3)[0]
    run(engine, [doc], SamplingParams(max_tokens=1, ignore_eos=True))
    for i, k in enumerate((12, 12, 20, 20, 12)):
        run(engine, [doc + prompts(1, k, seed=200 + i)[0]], FOLLOW)
    assert [key[0] for key in g.staged] == [64] and g.fallbacks["staged_first"] == 3 and g.replays == 2


def test_split_k_chunks_upgrade_to_staged_graphs(llama, artifact, monkeypatch):
    """A chunk of ``MIN_CHUNK`` to 64 tokens that split-K takes in a short bucket's graph (INT2 over a long prefix on
    a GPU; forced here) keeps that graph until its key repeats, then captures the staged graph and replays it: no
    step of it runs eagerly. Tokens and log-probs equal eager."""
    from oscarkv.engine import extend_graphs

    monkeypatch.setattr(extend_graphs, "_prefers_splitk", lambda k, p, page: True)
    doc = prompts(1, 40, seed=3)[0]
    asks = [doc + prompts(1, 40, seed=400 + i)[0] for i in range(3)]
    outs = []
    for graphs in (False, True):
        engine = _engine(llama, "bf16", artifact, False)  # NOTE: the tiny OSCAR window demotes what 40 tokens write
        if graphs:
            g = engine.runner.extend_graphs = ExtendGraphs(engine.runner, (2, 4, 8, 64), staged=(64,))
            g.splitk = True  # NOTE: the Triton backend's routing, over the oracle backend
        run(engine, [doc], SamplingParams(max_tokens=1, ignore_eos=True))
        outs.append([run(engine, [a], FOLLOW)[0] for a in asks])
    # NOTE: 4 replays: the document (split-K forced over no prefix), the first question, the capture, the third
    assert set(g.graphs) == {64} and len(g.staged) == 1 and g.replays == 4 and not g.fallbacks
    for a, b in zip(*outs):
        assert a.token_ids == b.token_ids
        assert max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs)) < 1e-4


def test_staged_capture_out_of_memory_runs_eagerly(llama, artifact, monkeypatch):
    """A staged graph the device has no memory for: that step runs eagerly and staged graphs stop (the short
    buckets' graphs go on); the tokens are the eager run's."""
    from oscarkv.engine import extend_graphs

    real = extend_graphs._Graph

    def graph(runner, kb, pool, backend=None):
        if backend is not None:
            raise torch.cuda.OutOfMemoryError("no room")
        return real(runner, kb, pool, backend)

    monkeypatch.setattr(extend_graphs, "_Graph", graph)
    doc = prompts(1, 40, seed=3)[0]
    asks = [doc + prompts(1, 12, seed=500 + i)[0] for i in range(3)]
    outs = []
    for graphs in (False, True):
        engine = _engine(llama, "bf16", artifact, graphs)
        if graphs:
            engine.runner.extend_graphs.staged_buckets = (16,)
        run(engine, [doc], SamplingParams(max_tokens=1, ignore_eos=True))
        outs.append([run(engine, [a], FOLLOW)[0] for a in asks])
    g = engine.runner.extend_graphs
    assert g.fallbacks["staged_memory"] == 1 and not g.staged_buckets and not g.staged and g.replays == 0
    assert [a.token_ids for a in outs[0]] == [b.token_ids for b in outs[1]]
