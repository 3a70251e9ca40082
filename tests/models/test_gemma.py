"""Gemma 3 against transformers on a tiny random config (no download): layer 0 slides over 12 tokens,
layer 1 is global; prompts of 30-50 tokens, so the window matters.

The paged model's logits equal transformers' on a dense forward (and differ without the window);
the engine with ``kv=bf16`` gives transformers' greedy tokens with chunked prefill and a prefix hit;
``kv=oscar`` with an artifact calibrated on the model equals ``OscarCache`` (whose sliding layers are
BF16 windows too); the decode route (Triton's) equals the extend route, and the Triton backend in the
interpreter gives the oracle's tokens up to a near-tie; a sliding layer's window pages
stay bounded while the context grows; the BPE the
engine reports is the bits its pages hold over the elements they hold.
"""

import pytest
import torch
from transformers import DynamicCache

from oscarkv.attention.backends import TritonAttention
from oscarkv.cache.hf_cache import OscarCache, WindowLayer
from oscarkv.cache.seq_kv import ChunkSchedule
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from oscarkv.models.llama import PagedLM
from oscarkv.models.loader import ModelLoadError, bf16_layers, check_config
from oscarkv.quant.bpe import window_start
from tests.engine.conftest import (D, HKV, WINDOWS, engine_config, hf_greedy, make_engine, prompts, run, tiny_config,
                                   tiny_model)
from tests.models.test_architectures import calibrated

ARCH, W, N = "Gemma3ForCausalLM", 12, 16


@pytest.fixture(scope="module")
def gemma():
    return tiny_model(ARCH)


@pytest.fixture(scope="module")
def gemma_artifact(gemma):
    return calibrated(gemma)


class BandedStep:
    """Dense causal attention over the chunk, banded to ``window`` keys on the ``sliding`` layers."""

    def __init__(self, scale: float, window: int, sliding: frozenset[int]) -> None:
        self.scale, self.window, self.sliding = scale, window, sliding

    def attention(self, layer, q, k, v):
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        i = torch.arange(q.shape[0])
        visible = (i[None] <= i[:, None]) & ((i[None] > i[:, None] - self.window) if layer in self.sliding else True)
        att = (torch.einsum("thd,shd->hts", q, k) * self.scale).masked_fill(~visible, float("-inf"))
        return torch.einsum("hts,shd->thd", att.softmax(-1), v)


def test_dense_forward_matches_transformers(gemma):
    ours, ids = PagedLM.from_hf(gemma), torch.randint(0, 128, (29,))
    assert bf16_layers(gemma.config) == {0} and ours.attention_scale == 24 ** -0.5
    with torch.no_grad():
        want = gemma(ids[None]).logits[0]
        got = ours.compute_logits(ours(ids, torch.arange(29), BandedStep(ours.attention_scale, W, frozenset({0}))))
        unbanded = ours.compute_logits(ours(ids, torch.arange(29), BandedStep(ours.attention_scale, W, frozenset())))
    assert (got - want).abs().max() < 1e-4
    assert (unbanded - want).abs().max() > 1e-2  # the window matters at 29 tokens
    assert want.abs().max() <= 30.0  # final_logit_softcapping


@pytest.mark.parametrize("chunked", [False, True])
def test_engine_bf16_matches_transformers(gemma, chunked):
    kw = dict(prefill_chunk=16, max_num_batched_tokens=32) if chunked else {}
    ps = prompts(2, 40)
    outs = run(make_engine(gemma, "bf16", **kw), ps)
    for p, out in zip(ps, outs):
        toks, lps = hf_greedy(gemma, p, N, DynamicCache(config=gemma.config), chunk=16 if chunked else None)
        assert out.token_ids[:N] == toks
        assert max(abs(a - b) for a, b in zip(out.logprobs, lps)) < 1e-4


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_prefix_hit_identical_to_cold(gemma, gemma_artifact, method):
    base = prompts(1, 70, seed=3)[0]
    b = base[:66] + [5, 6, 7, 8, 9]
    kw = dict(prefill_chunk=16, max_num_batched_tokens=32)
    warm = make_engine(gemma, method, gemma_artifact, **kw)
    run(warm, [base])
    hot = run(warm, [b])[0]
    assert warm.manager.hit_tokens == 64  # window pages [56, 64) and the global layers' [0, 64) were cached
    cold = run(make_engine(gemma, method, gemma_artifact, **kw), [b])[0]
    assert hot.token_ids == cold.token_ids and hot.logprobs == cold.logprobs


@pytest.mark.parametrize("chunked", [False, True])
def test_engine_oscar_with_a_calibrated_artifact(gemma, gemma_artifact, chunked):
    assert gemma_artifact.manifest["clip"]["key"][0] == 1.0  # the sliding layer: identity, unclipped
    assert torch.equal(gemma_artifact.tensors["key.rotation"][0], torch.eye(D).expand(HKV, D, D))
    kw = dict(prefill_chunk=16, max_num_batched_tokens=32) if chunked else {}
    ps = prompts(2, 41)
    outs = run(make_engine(gemma, "oscar", gemma_artifact, **kw), ps)
    for p, out in zip(ps, outs):
        cache = OscarCache(gemma.config, engine_config().kv, gemma_artifact)
        toks, _ = hf_greedy(gemma, p, N, cache, chunk=16 if chunked else None)
        assert out.token_ids[:N] == toks
        assert isinstance(cache.layers[0], WindowLayer) and cache.layers[0].keys.dtype == torch.bfloat16
        assert cache.layers[0].keys.shape[2] == W - 1


def test_oscar_cache_bf16_is_dynamic_cache(gemma):
    p = prompts(1, 30)[0]
    assert hf_greedy(gemma, p, N, OscarCache(gemma.config, engine_config("bf16").kv)) == \
        hf_greedy(gemma, p, N, DynamicCache(config=gemma.config))


def test_sliding_layer_memory_is_bounded_and_bpe_counts_it(gemma, gemma_artifact):
    """While one sequence grows from 20 to 140 tokens, the window pool holds exactly the pages of
    ``[window_start(t), t)`` (never more than (W + 2P - 2) // P), as the main pools grow; the engine's BPE
    is the bits of the pages it holds over their elements."""
    engine = make_engine(gemma, "oscar", gemma_artifact)
    engine.add_request("0", prompts(1, 20)[0], SamplingParams(max_tokens=120, temperature=0, ignore_eos=True))
    P, seen = WINDOWS["page_size"], []
    while engine.has_unfinished():
        engine.step()
        seq = engine.seqs.get("0")
        t, held = (seq.kv.num_tokens if seq else 0), engine.manager.window.pool.num_used
        if t:
            assert held == -(-t // P) - window_start(t, W, P) // P <= (W + 2 * P - 2) // P
            seen.append((t, held, engine.manager.int2.num_used))
            sink, hist, recent = engine.manager.tier_tokens(seq)
            window = t - seq.kv.window.first * P
            bits = 16 * (sink + recent) + (2 + 32 / D) * hist + 16 * window  # one global, one sliding layer
            assert engine.bpe(t) == pytest.approx(bits / (t + window))
    assert seen[-1][0] >= 130 and seen[-1][2] > seen[0][2]  # the INT2 history grew, the window did not
    need = [engine.manager.pages_needed(ChunkSchedule(20, 64), n)[2] for n in (200, 2000, 20_000)]
    assert need[0] == need[1] == need[2] <= -(-(W + 64 + 2 * P) // P)  # the worst step, chunks included


def test_a_qwen2_config_with_sliding_layers_is_windowed_the_same_way():
    """The window store is the config's ``layer_types``, not Gemma's: Qwen2 with ``use_sliding_window``
    (layer 1 slides over 12 tokens) gives transformers' tokens, chunked."""
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    config = tiny_config("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=W, max_window_layers=1)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.15)
    assert bf16_layers(model.config) == {1}
    ps = prompts(2, 40)
    for p, out in zip(ps, run(make_engine(model, "bf16", prefill_chunk=16, max_num_batched_tokens=32), ps)):
        toks, lps = hf_greedy(model, p, N, DynamicCache(config=model.config), chunk=16)
        assert out.token_ids[:N] == toks and max(abs(a - b) for a, b in zip(out.logprobs, lps)) < 1e-4


def test_preemption_resumes_exactly_and_frees_every_window_page(gemma, gemma_artifact):
    ps = [p[:24] for p in prompts(3, 24, seed=4)]
    params = [SamplingParams(max_tokens=20, temperature=0.8 if i % 2 else 0, seed=i, ignore_eos=True, logprobs=True)
              for i in range(len(ps))]
    roomy = run(make_engine(gemma, "oscar", gemma_artifact), ps, params)
    tight = make_engine(gemma, "oscar", gemma_artifact, kv_memory_bytes=80_000, bf16_fraction=0.5, max_num_seqs=3)
    preempted = []
    orig = tight.scheduler._preempt
    tight.scheduler._preempt = lambda seq, out: (preempted.append(seq.request_id), orig(seq, out))
    outs = run(tight, ps, params)
    assert preempted, "the pools were meant to be too small for all three requests"
    for a, b in zip(roomy, outs):
        assert a.token_ids == b.token_ids and max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    m = tight.manager
    assert m.bf16.num_used == m.int2.num_used == m.window.pool.num_used == 0  # nothing leaked


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_decode_route_matches_extend(gemma, gemma_artifact, method):
    """A backend whose one-token steps go to ``decode`` (the Triton backend's route, here on the PyTorch
    oracles) gives the extend route's tokens: its sliding layer reads its window view without the token
    written this step and attends to that token at full precision, as in extend; the global layer reads
    the decode view (tolerances of tests/engine/test_gpu_engine.py)."""
    from tests.engine.test_gpu_engine import _DecodeTorch, _compare

    ps = prompts(2, 37)
    ref = run(make_engine(gemma, method, gemma_artifact), ps)
    out = run(LLMEngine.from_hf(gemma, engine_config(method), gemma_artifact if method == "oscar" else None,
                                backend=_DecodeTorch()), ps)
    _compare(ref, out, 1e-4 if method == "bf16" else 2e-2)


def test_triton_backend_in_the_interpreter(gemma, gemma_artifact):
    """The Triton backend on the CPU (its kernels in Triton's interpreter, the sliding layer's band in PyTorch)
    gives the oracle backend's tokens up to a near-tie: its kernels round queries to bf16 and decode reads the
    current token as stored (test_gpu_engine's rule)."""
    from tests.engine.test_gpu_engine import _compare_prefix

    ps, params = prompts(1, 37), SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=True)
    ref = run(make_engine(gemma, "oscar", gemma_artifact), ps, params)
    out = run(LLMEngine.from_hf(gemma, engine_config("oscar"), gemma_artifact, backend=TritonAttention()), ps, params)
    _compare_prefix(ref, out, 0.25)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_triton_engine_matches_oracle_gpu(gemma, gemma_artifact, method):
    """The Triton backend (global layers on the kernels, the sliding layer's band in PyTorch, no CUDA graphs)
    gives the oracle backend's tokens on the same bf16 model up to a near-tie (test_gpu_engine's rule)."""
    from oscarkv.attention.backends import TorchAttention
    from tests.engine.test_gpu_engine import _compare_prefix

    model = tiny_model(ARCH).to("cuda", torch.bfloat16)
    art = gemma_artifact if method == "oscar" else None
    ps = prompts(3, 41)
    ref = run(LLMEngine.from_hf(model, engine_config(method), art, backend=TorchAttention()), ps)
    engine = LLMEngine.from_hf(model, engine_config(method), art, backend=TritonAttention())
    assert engine.runner.graphs is None  # the band runs eagerly
    _compare_prefix(ref, run(engine, ps), 0.25)


def test_tensor_parallelism_and_attention_softcapping_are_refused(gemma):
    with pytest.raises(ValueError, match="sliding-window layers: tensor parallelism is not supported"):
        LLMEngine.from_hf(gemma, engine_config("bf16", tensor_parallel_size=2))
    with pytest.raises(ModelLoadError, match="attn_logit_softcapping=50.0"):
        check_config(tiny_config(ARCH, attn_logit_softcapping=50.0), "test")


def test_decode_faithful_logits_band_the_sliding_layer(gemma, gemma_artifact):
    """The decode-faithful pass (eval) gets no mask from transformers for a custom attention: with windows
    that keep every token in BF16 it must still give the model's logits (the band applied)."""
    from oscarkv.config import KVConfig
    from oscarkv.eval.faithful import faithful_logits
    from oscarkv.quant.bpe import SlidingLayers
    from oscarkv.quant.codec import build_codec

    ids = torch.randint(0, 128, (1, 40))
    kv = KVConfig("oscar", group_size=D, sink=64, recent=256, page_size=8)
    codec = build_codec(kv, 2, HKV, D, gemma_artifact, SlidingLayers.from_config(gemma.config))
    with torch.no_grad():
        assert (faithful_logits(gemma, ids, codec) - gemma(ids).logits).abs().max() < 0.05  # BF16 K/V of layer 1


def test_calibrate_and_generate_from_a_model_directory(tmp_path, capsys):
    """The user's path: ``oscarkv calibrate`` a Gemma 3 directory, then ``oscarkv generate --kv oscar`` with that
    artifact; the streamed text is the offline API's with the same artifact."""
    from oscarkv.cli.flags import engine_config as flags_config
    from oscarkv.cli.main import build_parser, main
    from oscarkv.llm import LLM
    from oscarkv.models.loader import load_model
    from tests.byte_llama import SMALL, SPECIAL, byte_tokenizer

    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config(ARCH, vocab_size=len(SPECIAL) + 256, eos_token_id=256))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.15)
    model.save_pretrained(tmp_path / "gemma")
    byte_tokenizer().save_pretrained(tmp_path / "gemma")
    art = tmp_path / "art"
    assert main(["calibrate", "--model", str(tmp_path / "gemma"), "--out", str(art), "--tokens", "256",
                 "--heldout-tokens", "64", "--chunk", "64", "--dtype", "float32"]) == 0
    argv = ["generate", "--model", str(tmp_path / "gemma"), "--kv", "oscar", "--rotations", str(art), "--no-chat",
            "--prompt", "The quick brown fox jumps over the lazy dog", "--max-tokens", "12", *SMALL]
    capsys.readouterr()
    assert main(argv) == 0
    want = LLM(load_model(str(tmp_path / "gemma")), "oscar", rotations=art, config=flags_config(build_parser().parse_args(argv)))
    out = want.generate("The quick brown fox jumps over the lazy dog", SamplingParams(12, 0.0))[0]
    assert capsys.readouterr().out == f"{out.text}\n[{out.finish_reason}, {len(out.token_ids)} tokens]\n"


def test_teacher_forced_scoring_keeps_the_window_aligned(gemma):
    """eval's teacher-forced path stores a prefilled document into ``OscarCache`` (the sliding layer gets only
    its last W - 1 tokens, and the document's length): with ``kv=bf16`` its answer NLL is that of one forward
    over the whole text."""
    from oscarkv.config import KVConfig
    from oscarkv.eval.runner import prefill, score_sample
    from oscarkv.quant.bpe import SlidingLayers
    from oscarkv.quant.codec import build_codec

    ids = torch.tensor([prompts(1, 40, seed=7)[0]])  # document 30, question 4, answer 6
    doc, q, target = ids[:, :30], ids[:, 30:34], ids[:, 34:40]
    codec = build_codec(KVConfig("bf16"), 2, HKV, D, sliding=SlidingLayers.from_config(gemma.config))
    _, nll, cache = score_sample(gemma, prefill(gemma, doc), codec, q, target[0][None], [(0, 6)])
    assert cache.get_seq_length() == 39 and cache.layers[0].keys.shape[2] == W - 1  # positions of the whole text
    with torch.no_grad():
        logits = gemma(ids[:, :-1]).logits[0, 33:].float()
    assert nll == pytest.approx(float(torch.nn.functional.cross_entropy(logits, target[0])), abs=1e-4)


def test_export_leaves_the_sliding_layer_out_and_imports_back(gemma, gemma_artifact, tmp_path):
    """``export-rotations`` of a calibrated Gemma 3 artifact writes the global layer only (sparse layer ids, as the
    reference's files of hybrid models); importing them with the sliding layer as ``bf16_layers`` restores it."""
    from oscarkv.quant.reference import export_rotations, import_rotations

    assert gemma_artifact.manifest["bf16_layers"] == [0]
    paths, _ = export_rotations(gemma_artifact, tmp_path, "tiny-gemma")
    assert list(torch.load(paths[0], weights_only=True)["layers"]) == [1]
    back = import_rotations(tmp_path, gemma.config, bf16_layers=bf16_layers(gemma.config))
    for kind in ("key", "value"):
        assert torch.equal(back.tensors[f"{kind}.rotation"], gemma_artifact.tensors[f"{kind}.rotation"])


def test_a_new_conversation_hits_the_document_after_a_long_chat(gemma, gemma_artifact):
    """A chat resuming at its turns, then a request sharing only the document: it hits at the last prefill-chunk
    multiple, because each hit keeps the pages a hit there needs (the BF16 recent window and the sliding layer's
    window pages: ``KVCacheManager._keep_restore_points``); without the window pages' part it hit 0 here."""
    engine = make_engine(gemma, "oscar", gemma_artifact, prefill_chunk=16, max_num_seqs=1)
    doc, params = prompts(1, 200, seed=3)[0], SamplingParams(max_tokens=1, ignore_eos=True)

    def serve(rid, ids, resume=()):
        hits = engine.manager.hit_tokens
        engine.add_request(rid, ids, params, resume=resume)
        while engine.has_unfinished():
            engine.step()
        return engine.manager.hit_tokens - hits

    serve("doc", doc)
    assert all(serve(f"turn{i}", doc + prompts(1, 16, seed=10 + i)[0], (len(doc),)) == 200 for i in range(8))
    assert serve("new", doc + [5]) == 192
