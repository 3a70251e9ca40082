"""The engine against transformers: kv=bf16 ≡ DynamicCache, quantized kv ≡ OscarCache.

Tiny random models on the CPU (fp32). Prompts are long enough for the sink, INT2 history and
recent window to be populated and for decode steps to demote pages (sink 8, recent 16,
page 8). Tolerances: tokens identical; log-probabilities within 1e-4 (float reordering of
the same arithmetic: the engine's value rotation is folded into the weights, its attention
runs in fp32 over the same stored bytes). Quantized methods: within 2e-3 — a value whose
rotation is folded into ``v_proj`` differs from OscarCache's runtime rotation by float
reordering (~1e-7 relative), and where that moves a group's min/max across an fp16 rounding
boundary of the stored scale or zero, or a code across a rounding boundary, the stored
value moves by up to one fp16 ulp or one code step (measured worst case here: 2.2e-4).
"""

from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache

from oscarkv.cache.hf_cache import OscarCache
from tests.engine.conftest import engine_config, hf_greedy, make_engine, prompts, run, tiny_model

N = 24
TOL = 1e-4
TOL_Q = 2e-3


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_bf16_matches_transformers(arch):
    model = tiny_model(arch)
    ps = prompts(3, 30)
    outs = run(make_engine(model, "bf16"), ps)  # batched: 3 sequences per step
    for p, out in zip(ps, outs):
        toks, lps = hf_greedy(model, p, N, DynamicCache(config=model.config))
        assert out.token_ids == toks
        assert max(abs(a - b) for a, b in zip(out.logprobs, lps)) < TOL


@pytest.mark.parametrize("method", ["naive", "quarot", "oscar"])
def test_quantized_matches_oscar_cache(llama, artifact, method):
    art = artifact if method == "oscar" else None
    ps = prompts(3, 41)
    outs = run(make_engine(llama, method, art), ps)
    for p, out in zip(ps, outs):
        toks, lps = hf_greedy(llama, p, N, OscarCache(llama.config, engine_config(method).kv, art))
        assert out.token_ids == toks
        assert max(abs(a - b) for a, b in zip(out.logprobs, lps)) < TOL_Q


@pytest.mark.parametrize("method,bits", [("oscar", (4, 2)), ("oscar", (2, 4)), ("oscar", (4, 4)), ("int4", (2, 2))],
                         ids=["oscar-k4v2", "oscar-k2v4", "oscar-int4", "int4"])
def test_ladder_rungs_match_oscar_cache(llama, artifact, method, bits):
    """The precision ladder (4-bit keys and/or values as two INT2 planes in the engine's pages), and
    per-token 4-bit without rotation, ≡ OscarCache, as for INT2."""
    art = artifact if method == "oscar" else None
    kv = replace(engine_config(method).kv, key_bits=bits[0], value_bits=bits[1])
    ps = prompts(2, 41)
    outs = run(make_engine(llama, method, art, kv=kv), ps)
    for p, out in zip(ps, outs):
        toks, lps = hf_greedy(llama, p, N, OscarCache(llama.config, kv, art))
        assert out.token_ids == toks
        assert max(abs(a - b) for a, b in zip(out.logprobs, lps)) < TOL_Q


@pytest.mark.parametrize("method,bits", [("bf16", (2, 2)), ("oscar", (2, 2)), ("oscar", (4, 2))],
                         ids=["bf16", "oscar", "oscar-k4v2"])
def test_chunked_prefill(llama, artifact, method, bits):
    """bf16: chunked ≡ unchunked. oscar (INT2, and a rung of the ladder): a later chunk sees earlier
    ones as stored, so the engine's chunked prefill must equal OscarCache fed the same chunks."""
    ps = prompts(2, 50)
    kv = replace(engine_config(method).kv, key_bits=bits[0], value_bits=bits[1])
    chunked = run(make_engine(llama, method, artifact, prefill_chunk=16, max_num_batched_tokens=32, kv=kv), ps)
    whole = run(make_engine(llama, method, artifact, kv=kv), ps)
    for p, c, w in zip(ps, chunked, whole):
        if method == "bf16":
            assert c.token_ids == w.token_ids
            assert max(abs(a - b) for a, b in zip(c.logprobs, w.logprobs)) < TOL
        else:
            toks, lps = hf_greedy(llama, p, N, OscarCache(llama.config, kv, artifact), chunk=16)
            assert c.token_ids == toks
            assert max(abs(a - b) for a, b in zip(c.logprobs, lps)) < TOL_Q


def written_pages(llama, artifact, kv):
    """One 45-token prompt and 12 greedy tokens through the engine, then the tokens it had cached through
    ``OscarCache``: ``(the engine's pools, the cache, the INT2 history pages of the sequence)``."""
    from oscarkv.engine.request import SamplingParams

    engine = make_engine(llama, "oscar", artifact, kv=kv)
    engine.add_request("0", prompts(1, 45)[0], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    seq, snap = engine.seqs["0"], None
    while engine.has_unfinished():
        engine.step()
        if seq.kv.num_tokens:
            snap = (list(seq.kv.history), list(seq.token_ids[:seq.kv.num_tokens]))
    pages, toks = snap
    cache = OscarCache(llama.config, kv, artifact)
    hf_greedy(llama, toks, 0, cache)
    return engine.runner.pools, cache, pages


@pytest.mark.parametrize("key_bits", [2, 4])
def test_write_path_bit_identical_to_oscar_cache(llama, artifact, key_bits):
    """INT2 (and 4-bit) key pages of the engine hold the same bytes as OscarCache's history (same keys in)."""
    pools, cache, pages = written_pages(llama, artifact, replace(engine_config().kv, key_bits=key_bits))
    for layer in range(llama.config.num_hidden_layers):
        store = cache.layers[layer].rows[0][0]  # keys
        blocks = getattr(store, "blocks", None) or getattr(store, "pages")
        theirs = torch.cat([b.codes for b in blocks]), torch.cat([b.scale for b in blocks])
        mine = (torch.cat([pools.int2_k.codes[layer, pg].transpose(0, 1) for pg in pages]),
                torch.cat([pools.int2_k.scale[layer, pg].transpose(0, 1) for pg in pages]))
        if layer == 0:  # layer 0's keys are bit-identical inputs; later layers differ by float order
            assert torch.equal(mine[0], theirs[0]) and torch.equal(mine[1], theirs[1])
        else:
            assert (mine[0] != theirs[0]).float().mean() < 0.01


def test_eager_step_demotes_prefix_pages_before_and_its_own_after():
    """An eager step demotes every layer at once: pages it does not write before the forward (its chunk reads
    them as INT2), pages it writes after it (each layer has written them by then)."""
    from oscarkv.cache.manager import WritePlan
    from oscarkv.engine.model_runner import _demotions

    P = 4
    a = WritePlan(8, 16, slots=[20 + i for i in range(8)], demote_src=[2, 5], demote_dst=[0, 1])  # writes pages 5, 6
    b = WritePlan(3, 4, slots=[33], demote_src=[7], demote_dst=[2])  # a decode row: page 7 is old
    old, own = _demotions([a, b], P)
    assert old == ([2, 7], [0, 2]) and own == ([5], [1])
