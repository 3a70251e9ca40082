"""A per-layer precision allocation served by the engine: each layer's history pages at its own bits,
pools holding what the accounting counts, output ≡ OscarCache (the reference path), and an allocation
of equal layers ≡ the uniform recipe bit for bit; a per-head key allocation likewise (each layer two head
ranges, its heads permuted at load). Tiny random models on the CPU (see test_equivalence)."""

from dataclasses import replace

import pytest
import torch

from oscarkv.cache.hf_cache import OscarCache
from oscarkv.quant.codec import build_codec
from tests.engine.conftest import D, HKV, L, engine_config, hf_greedy, make_engine, prompts, run
from tests.engine.test_equivalence import N, TOL_Q

MIXED = dict(layer_key_bits=(4, 2), layer_value_bits=(2, 4))
HEADS = dict(layer_key_heads=((1,), (0,)))  # layer 0 keeps head 0 at 2 bits; layer 1 moves head 0 after head 1
ALLOCS = {"layers": MIXED, "heads": HEADS}


def test_mixed_allocation_matches_oscar_cache(llama, artifact):
    kv = replace(engine_config().kv, **MIXED)
    ps = prompts(2, 41)
    outs = run(make_engine(llama, "oscar", artifact, kv=kv), ps)
    for p, out in zip(ps, outs):
        toks, lps = hf_greedy(llama, p, N, OscarCache(llama.config, kv, artifact))
        assert out.token_ids == toks
        assert max(abs(a - b) for a, b in zip(out.logprobs, lps)) < TOL_Q


def test_equal_layers_are_the_uniform_recipe_bit_for_bit(llama, artifact):
    base = engine_config().kv
    uniform = make_engine(llama, "oscar", artifact, kv=replace(base, key_bits=4))
    per_layer = make_engine(llama, "oscar", artifact, kv=replace(base, layer_key_bits=(4,) * L, layer_value_bits=(2,) * L))
    assert per_layer.runner.pools.geo == uniform.runner.pools.geo
    ps = prompts(2, 41)
    for a, b in zip(run(per_layer, ps), run(uniform, ps)):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    for kind in ("int2_k", "int2_v"):  # the same bytes in the same pool tensors
        mine, theirs = getattr(per_layer.runner.pools, kind), getattr(uniform.runner.pools, kind)
        assert all(torch.equal(getattr(mine, f), getattr(theirs, f)) for f in ("codes", "scale", "zero"))


def test_mixed_pools_store_what_the_accounting_counts(llama, artifact):
    kv = replace(engine_config().kv, **MIXED)
    engine = make_engine(llama, "oscar", artifact, kv=kv)
    pools = engine.runner.pools
    geo = pools.geo
    assert geo.layer_bits == ((4, 2), (2, 4)) and pools.int2_k is None  # no one tensor holds both formats
    assert pools.nbytes()["int2"] == geo.int2_pages * geo.int2_page_bytes()
    for i, (kb, vb) in enumerate(geo.layer_bits):
        view = pools.layer(i)
        assert (view.int2_k.bits, view.int2_v.bits) == (kb, vb)
        assert view.int2_k.codes.shape == (geo.int2_pages, HKV, geo.page_size, D * kb // 8)
    # a history page's bytes per element equal the codec's BPE of an all-history sequence
    codec = build_codec(kv.without_windows(), L, HKV, D, artifact)
    elements = 2 * L * HKV * geo.page_size * D
    assert 8 * geo.int2_page_bytes() / elements == pytest.approx(codec.bpe(1 << 16), rel=1e-12)


def test_mixed_pages_hold_oscar_cache_bytes(llama, artifact):
    """Layer 0 (4-bit keys, 2-bit values) stores the same bytes as OscarCache's history."""
    from tests.engine.test_equivalence import written_pages

    pools, cache, pages = written_pages(llama, artifact, replace(engine_config().kv, **MIXED))
    view = pools.layer(0)
    for kind, pool in ((0, view.int2_k), (1, view.int2_v)):
        blocks = getattr(cache.layers[0].rows[0][kind], "blocks", None) or cache.layers[0].rows[0][kind].pages
        assert torch.equal(torch.cat([pool.codes[pg].transpose(0, 1) for pg in pages]), torch.cat([b.codes for b in blocks]))


@pytest.mark.parametrize("alloc", ["layers", "heads"])
def test_triton_demote_all_encodes_each_layer_at_its_bits(llama, artifact, alloc):
    """CUDA graphs demote every layer at once (``demote_all``): under an allocation the Triton backend demotes
    layer by layer into each layer's own pool, the same bytes as the PyTorch oracle (the interpreter here)."""
    from oscarkv.attention.backends import TorchAttention, TritonAttention

    pools = []
    for backend in (TorchAttention(), TritonAttention()):
        engine = make_engine(llama, "oscar", artifact, kv=replace(engine_config().kv, **ALLOCS[alloc]))
        r = engine.runner
        g = torch.Generator().manual_seed(0)
        for i in range(L):
            view = r.pools.layer(i)
            view.bf16_k[1:3].copy_(torch.randn(view.bf16_k[1:3].shape, generator=g))
            view.bf16_v[1:3].copy_(torch.randn(view.bf16_v[1:3].shape, generator=g))
        src, dst = torch.tensor([1, 2], dtype=torch.int32), torch.tensor([2, 1], dtype=torch.int32)
        backend.demote_all(r.pools, r.storage, src, dst)
        pools.append(r.pools)
    for i in range(L):
        for kind in ("int2_k", "int2_v"):
            for (_, x), (_, y) in zip(*(p.parts(i) for p in pools)):
                a, b = getattr(x, kind), getattr(y, kind)
                assert a.bits == b.bits and torch.equal(a.codes[1:3], b.codes[1:3]) and torch.equal(a.scale[1:3], b.scale[1:3])
                assert a.codes[1:3].any()


def test_demotion_buckets_repeat_the_last_page():
    """A demotion graph's bucket of ``n`` pages: the step's pairs, then its last pair again (the same page encoded
    into the same place: the same bytes), src then dst in one staging copy."""
    from oscarkv.engine.cuda_graphs import padded_pages

    assert padded_pages([5, 7], [1, 2], 4) == [5, 7, 7, 7, 1, 2, 2, 2]
    assert padded_pages([3], [9], 1) == [3, 9]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pages", [1, 3, 70])
def test_demotion_graphs_store_the_eager_bytes_gpu(artifact, pages):
    """Per-head pools demote by graph replays (``DemoteGraphs``: buckets of powers of two, a count between them
    padded, more than the largest in several replays): every layer and head range holds the bytes the eager
    launches store."""
    from tests.engine.conftest import tiny_model
    from oscarkv.engine.engine import LLMEngine

    model = tiny_model().to("cuda", torch.bfloat16)
    cfg = engine_config()
    cfg = replace(cfg, kv_memory_bytes=4 * cfg.kv_memory_bytes, kv=replace(cfg.kv, **HEADS))
    out = []
    for graphs in (True, False):
        r = LLMEngine.from_hf(model, cfg, artifact).runner
        assert r.demote_graphs is not None
        r.demote_graphs = r.demote_graphs if graphs else None
        g = torch.Generator(device="cuda").manual_seed(0)
        r.pools.bf16_k.copy_(torch.randn(r.pools.bf16_k.shape, generator=g, device="cuda"))
        r.pools.bf16_v.copy_(torch.randn(r.pools.bf16_v.shape, generator=g, device="cuda"))
        src = [1 + i % (r.pools.geo.bf16_pages - 1) for i in range(pages)]
        r.demote_all(src, list(range(1, pages + 1)))
        out.append([getattr(kv, kind) for i in range(L) for _, kv in r.pools.parts(i) for kind in ("int2_k", "int2_v")])
    for a, b in zip(*out):
        assert all(torch.equal(getattr(a, f)[1:pages + 1], getattr(b, f)[1:pages + 1]) for f in ("codes", "scale", "zero"))
        assert a.codes[1:pages + 1].any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("alloc", ["layers", "heads"])
def test_triton_engine_allocation_matches_oracle_gpu(artifact, alloc):
    """An allocation through the Triton kernels and CUDA graphs ≡ the PyTorch oracles (test_gpu_engine's bound)."""
    from oscarkv.attention.backends import TorchAttention
    from oscarkv.engine.engine import LLMEngine
    from tests.engine.conftest import tiny_model
    from tests.engine.test_gpu_engine import _compare_prefix

    model = tiny_model().to("cuda", torch.bfloat16)
    cfg = engine_config()
    cfg = replace(cfg, kv=replace(cfg.kv, **ALLOCS[alloc]))
    ps = prompts(5, 61)
    triton_engine = LLMEngine.from_hf(model, cfg, artifact)
    assert triton_engine.runner.graphs
    out = run(triton_engine, ps)
    ref = run(LLMEngine.from_hf(model, cfg, artifact, backend=TorchAttention()), ps)
    _compare_prefix(ref, out, 0.25)




def test_per_head_allocation_matches_oscar_cache(llama, artifact):
    """4-bit keys in one KV head of each layer, served as two head ranges (heads permuted at load) ≡ OscarCache,
    which stores each head at its bits in the model's own head order."""
    kv = replace(engine_config().kv, **HEADS)
    engine = make_engine(llama, "oscar", artifact, kv=kv)
    assert [[(p.hi - p.lo, p.bits) for p, _ in engine.runner.pools.parts(i)] for i in range(L)] == [[(1, (2, 2)), (1, (4, 2))]] * L
    ps = prompts(2, 41)
    for p, out in zip(ps, run(engine, ps)):
        toks, lps = hf_greedy(llama, p, N, OscarCache(llama.config, kv, artifact))
        assert out.token_ids == toks
        assert max(abs(a - b) for a, b in zip(out.logprobs, lps)) < TOL_Q


def test_engines_sharing_one_model_serve_what_one_engine_serves(llama, artifact):
    """Engines built in turn from one PagedLM (a bench's plain and speculating engines) permute its heads and fold its
    values in place once between them, whichever heads each splits: each serves the tokens and log-probs of an engine of
    its own."""
    from oscarkv.engine.engine import LLMEngine
    from oscarkv.models.llama import PagedLM

    ps = prompts(2, 41)
    kvs = {"heads": replace(engine_config().kv, **HEADS), "uniform": engine_config().kv}
    want = {name: run(make_engine(llama, "oscar", artifact, kv=kv), ps) for name, kv in kvs.items()}
    shared = PagedLM.from_hf(llama)
    for name in ("heads", "heads", "uniform", "heads"):
        got = run(LLMEngine.from_paged(shared, engine_config("oscar", kv=kvs[name]), artifact), ps)
        assert [(o.token_ids, o.logprobs) for o in got] == [(o.token_ids, o.logprobs) for o in want[name]], name


def test_per_head_pages_hold_oscar_cache_bytes(llama, artifact):
    """Each head range stores OscarCache's bytes of its heads (layer 1: heads permuted, the 4-bit head 0 last)."""
    from tests.engine.test_equivalence import written_pages

    pools, cache, pages = written_pages(llama, artifact, replace(engine_config().kv, **HEADS))
    for layer, order in ((0, [0, 1]), (1, [1, 0])):
        row = cache.layers[layer].rows[0]
        for j, ((part, view), head) in enumerate(zip(pools.parts(layer), order)):  # range j: HeadPacked part j
            assert (view.int2_k.bits, view.int2_v.bits) == ((2, 2), (4, 2))[j]
            for kind, pool in ((0, view.int2_k), (1, view.int2_v)):
                blocks = getattr(row[kind], "blocks", None) or row[kind].pages
                got = torch.cat([pool.codes[pg].transpose(0, 1) for pg in pages])  # [tokens, 1, bytes]
                want = torch.cat([b.parts[j].codes if kind == 0 else b.codes[:, [head]] for b in blocks])
                assert torch.equal(got, want)


def test_per_head_pools_store_what_the_accounting_counts(llama, artifact):
    kv = replace(engine_config().kv, **HEADS)
    pools = make_engine(llama, "oscar", artifact, kv=kv).runner.pools
    geo = pools.geo
    assert pools.nbytes()["int2"] == geo.int2_pages * geo.int2_page_bytes()
    codec = build_codec(kv.without_windows(), L, HKV, D, artifact)
    elements = 2 * L * HKV * geo.page_size * D
    assert 8 * geo.int2_page_bytes() / elements == pytest.approx(codec.bpe(1 << 16), rel=1e-12)
