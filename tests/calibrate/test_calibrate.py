"""Calibration on a tiny random Llama: statistics against independent computations, the solved
rotations and clips, the artifact round trip and the attention-implementation restore."""

import random
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from oscarkv.calibrate import calibrate, format_summary
from oscarkv.calibrate.solve import round_trips, solve_rotations, value_objective
from oscarkv.calibrate.stats import HeldoutCapture, StatsCollector, calibration_mode, run_forward
from oscarkv.config import CalibrationConfig, KVConfig
from oscarkv.models.loader import LoadedModel
from oscarkv.quant.artifact import Artifact, ModelFingerprint
from oscarkv.quant.codec import TensorCodec, build_codec
from oscarkv.quant.rotation import compose, hadamard, orthogonality_error

L, HQ, HKV, D, VOCAB = 2, 4, 2, 16, 100
REP = HQ // HKV
CFG = CalibrationConfig(tokens=96, chunk=32, heldout_tokens=32)


class CharTokenizer:
    """Stand-in tokenizer: one token per character."""

    def __call__(self, text, add_special_tokens=False, verbose=False):
        return {"input_ids": [ord(ch) % VOCAB for ch in text]}


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=L, num_attention_heads=HQ,
                         num_key_value_heads=HKV, head_dim=D, vocab_size=VOCAB, initializer_range=0.2,
                         architectures=["LlamaForCausalLM"])
    model = LlamaForCausalLM(config).eval()
    model.config._attn_implementation = "sdpa"
    return LoadedModel(model, CharTokenizer(), "tiny-random")


def text(n: int = 400, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghij klmnopqrstuvwxyz.") for _ in range(n))


def chunks(n: int, length: int = 32, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (1, length), generator=g) for _ in range(n)]


def collect(model, batches) -> StatsCollector:
    col = StatsCollector(L, HKV, D)
    run_forward(model, batches, col, "test")
    return col


def manual_qkv(model, batches, impl: str = "sdpa") -> list[dict[str, list[torch.Tensor]]]:
    """Per layer: post-RoPE q, k, v recomputed from the attention inputs, and the per-head outputs
    (input of o_proj) of a plain forward with attention implementation ``impl``."""
    got = [{"q": [], "k": [], "v": [], "o": []} for _ in range(L)]

    def pre_attn(i):
        def hook(mod, args, kwargs):
            h = kwargs["hidden_states"]
            shape = (*h.shape[:-1], -1, D)
            q, k = (p(h).view(shape).transpose(1, 2) for p in (mod.q_proj, mod.k_proj))
            q, k = apply_rotary_pos_emb(q, k, *kwargs["position_embeddings"])
            got[i]["q"].append(q), got[i]["k"].append(k), got[i]["v"].append(mod.v_proj(h).view(shape).transpose(1, 2))
        return hook

    def pre_out(i):
        def hook(mod, args):
            got[i]["o"].append(args[0].unflatten(-1, (HQ, D)).transpose(1, 2))  # [B, Hq, T, d]
        return hook

    handles = []
    for i, layer in enumerate(model.model.layers):
        handles.append(layer.self_attn.register_forward_pre_hook(pre_attn(i), with_kwargs=True))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(pre_out(i)))
    previous, model.config._attn_implementation = model.config._attn_implementation, impl
    try:
        with torch.inference_mode():
            for ids in batches:
                model(ids, use_cache=False)
    finally:
        model.config._attn_implementation = previous
        for h in handles:
            h.remove()
    return got


def group_moment(xs: list[torch.Tensor]) -> torch.Tensor:
    """``(1/N) Σ_t Σ_g x_gᵀx_g`` per KV head from ``[B, H, T, d]`` tensors (H query or KV heads)."""
    x = torch.cat([t.double() for t in xs], dim=2)  # [1, H, N, d]
    per_head = torch.einsum("bhnd,bhne->hde", x, x) / x.shape[2]
    return per_head.reshape(HKV, -1, D, D).sum(1)


def test_query_and_key_statistics_match_manual_projection(loaded):
    batches = chunks(3)
    stats = collect(loaded.model, batches).finalize()
    ref = manual_qkv(loaded.model, batches)
    assert stats.tokens == 96
    for i in range(L):
        assert torch.allclose(stats.c_q[i], group_moment(ref[i]["q"]), rtol=1e-5, atol=1e-6)
        assert torch.allclose(stats.c_k[i], group_moment(ref[i]["k"]), rtol=1e-5, atol=1e-6)
        k, v = (torch.cat(ref[i][n], 2).double() for n in "kv")
        assert torch.allclose(stats.key_mean[i], k.mean(2)[0], atol=1e-5)
        assert torch.allclose(stats.value_mean[i], v.mean(2)[0], atol=1e-5)


def test_output_moment_matches_eager_attention(loaded):
    batches = chunks(2, seed=1)
    stats = collect(loaded.model, batches).finalize()
    ref = manual_qkv(loaded.model, batches, impl="eager")
    for i in range(L):
        assert torch.allclose(stats.c_s[i], group_moment(ref[i]["o"]), rtol=1e-4, atol=1e-6)


def test_proxy_is_key_weighted_value_moment(loaded):
    # One chunk: the running C_Q estimate is the final one, so the proxy is exact.
    batches = chunks(1, seed=2)
    stats = collect(loaded.model, batches).finalize()
    ref = manual_qkv(loaded.model, batches)
    for i in range(L):
        k, v = (ref[i][n][0][0].double() for n in "kv")  # [Hkv, T, d]
        w = torch.einsum("htd,hde,hte->ht", k, stats.c_q[i], k)
        want = torch.einsum("ht,htd,hte->hde", w, v, v) / k.shape[1]
        assert torch.allclose(stats.c_proxy[i], want, rtol=1e-4, atol=1e-6)


def test_calibration_attention_gives_the_model_outputs(loaded):
    ids = chunks(1, seed=3)[0]
    with torch.inference_mode():
        want = loaded.model(ids, use_cache=False).logits
        with calibration_mode(loaded.model):
            got = loaded.model(ids, use_cache=False, oscar_stats=None).logits
    assert torch.allclose(got, want, atol=1e-5)


def test_value_objective_is_output_error_over_every_query(loaded):
    cap = HeldoutCapture()
    run_forward(loaded.model, chunks(1, seed=4), cap, "test")
    held = cap.layer(1)  # T = 32 < VALUE_QUERY_ROWS: every query row is used
    e = torch.randn(3, 32, HKV, D)  # [n, B·T, H, d]
    logits = held.query @ held.key.repeat_interleave(REP, 1).transpose(-1, -2) * held.scaling
    s = torch.softmax(logits.masked_fill(torch.ones(32, 32).triu(1).bool(), float("-inf")), -1)[0]  # [Hq, T, T]
    want = [(s @ en.transpose(0, 1).repeat_interleave(REP, 0)).double().square().sum() / 32 for en in e]
    assert torch.allclose(value_objective(held)(e), torch.stack(want), rtol=1e-5)


def test_round_trips_are_the_codec_path():
    torch.manual_seed(0)
    x = torch.randn(40, HKV, D) * 3
    rot = compose(torch.linalg.qr(torch.randn(HKV, D, D))[0], "uhp")
    codec = TensorCodec(2, 8, rot, torch.randn(HKV, D))
    for got, c in zip(round_trips(codec, [1.0, 0.9, 0.74], x), [1.0, 0.9, 0.74]):
        assert torch.equal(got, replace(codec, clip=c).fake(x))


@pytest.fixture(scope="module")
def default_run(loaded):
    return calibrate(loaded, CFG, [text()], "random letters")


def test_rotations_are_sorted_orthogonal_eigenbases(loaded, default_run):
    art, _ = default_run
    stats = collect(loaded.model, chunks(3)).finalize()
    t = solve_rotations(stats, CFG)
    for kind in ("key", "value"):
        evals, u = art.tensors[f"{kind}.eigenvalues"], art.tensors[f"{kind}.eigvecs"]
        assert (evals[..., :-1] >= evals[..., 1:]).all()
        assert orthogonality_error(art.tensors[f"{kind}.rotation"]) < 1e-5
        assert torch.allclose(art.tensors[f"{kind}.rotation"], compose(u, "uhp"))
    c = stats.c_q  # the key eigenbasis diagonalizes C_Q
    recon = t["key.eigvecs"].double() @ torch.diag_embed(t["key.eigenvalues"].double()) @ t["key.eigvecs"].double().mT
    assert torch.allclose(recon, c, rtol=1e-4, atol=1e-4 * float(c.abs().max()))


def test_artifact_saves_and_loads(loaded, default_run, tmp_path):
    art, rows = default_run
    fp = ModelFingerprint.from_config(loaded.config)
    back = Artifact.load(art.save(tmp_path), expect=fp)
    m = back.manifest
    assert m["method"] == "oscar" and m["group_size"] == D and m["options"]["tokens"] == 96
    assert m["calibration"]["tokens"] == 96 and m["calibration"]["heldout_tokens"] == 32
    assert m["calibration"]["source"] == "random letters" and len(m["summary"]) == L
    assert all(torch.equal(back.tensors[k], v.float()) for k, v in art.tensors.items())
    codec = build_codec(KVConfig("oscar"), L, HKV, D, back)
    assert codec.layers[0].key.rotation.shape == (HKV, D, D)


def test_fitted_clips_lie_in_grid(default_run):
    art, rows = default_run
    for kind in ("key", "value"):
        assert len(art.manifest["clip"][kind]) == L
        assert all(c in CFG.clip_grid for c in art.manifest["clip"][kind])
    assert all(r["key_error_ratio"] > 0 and r["value_error_ratio"] > 0 for r in rows)


@pytest.mark.parametrize("clip,want", [("fixed", {"key": 0.96, "value": 0.92}), ("none", {"key": 1.0, "value": 1.0})])
def test_fixed_and_no_clip(loaded, clip, want):
    art, _ = calibrate(loaded, replace(CFG, clip=clip), [text()])
    for kind in ("key", "value"):
        assert art.manifest["clip"][kind] == [want[kind]] * L


def test_share_heads_gives_identical_rotations(loaded):
    art, _ = calibrate(loaded, replace(CFG, share_heads=True, value_objective="proxy"), [text()])
    for kind in ("key", "value"):
        r = art.tensors[f"{kind}.rotation"]
        assert torch.equal(r, r[:, :1].expand_as(r))
    assert not torch.equal(art.tensors["key.mean"][:, 0], art.tensors["key.mean"][:, 1])  # means stay per head


def test_hadamard_rotation_and_no_centering(loaded):
    art, _ = calibrate(loaded, replace(CFG, rotation="h", center=False), [text()])
    h = hadamard(D).float()
    for kind in ("key", "value"):
        assert torch.equal(art.tensors[f"{kind}.rotation"], h.expand(L, HKV, D, D))
        assert not art.tensors[f"{kind}.mean"].any()


def test_per_kind_centering_and_clip_modes(loaded):
    """``center="keys"`` centers keys only; ``clip="fixed/none"`` sets each kind's mode."""
    art, _ = calibrate(loaded, replace(CFG, center="keys", clip="fixed/none"), [text()])
    assert art.tensors["key.mean"].any() and not art.tensors["value.mean"].any()
    assert art.manifest["clip"] == {"key": [0.96] * L, "value": [1.0] * L}
    with pytest.raises(ValueError, match="KEYS/VALUES"):
        CalibrationConfig(clip="fixed/fitted/none")
    with pytest.raises(ValueError, match="center must be one of"):
        CalibrationConfig(center="key")
    assert CalibrationConfig(center=False).center == "none"  # format-2 manifests recorded a boolean


def test_attention_implementation_is_restored(loaded, default_run):
    assert loaded.model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError), calibration_mode(loaded.model):
        assert loaded.model.config._attn_implementation != "sdpa"
        raise RuntimeError("boom")
    assert loaded.model.config._attn_implementation == "sdpa"


def test_short_text_is_a_clear_error(loaded):
    with pytest.raises(ValueError, match="too short: 100 tokens.*128 are needed"):
        calibrate(loaded, CFG, [text(100)])


def test_format_summary(default_run):
    _, rows = default_run
    lines = format_summary(rows).splitlines()
    assert len(lines) == 2 + L + 1 and lines[-1].startswith(" mean")
    assert len({len(line) for line in lines[1:]}) == 1  # fixed width


def test_importance_scaling_lowers_the_weighted_error():
    """Queries concentrated on few directions, keys spread evenly: scaling the eigen-channels by
    (λ/v)^(1/4) before the Hadamard cuts the query-weighted INT2 error, as its derivation says."""
    from oscarkv.calibrate.solve import importance_scale, key_objective
    from oscarkv.quant.artifact import scaled_transform

    g = torch.Generator().manual_seed(3)
    d, heads = 32, 1
    u = torch.linalg.qr(torch.randn(heads, d, d, generator=g, dtype=torch.float64))[0]
    lam = torch.cat([torch.full((4,), 10.0), torch.full((d - 4,), 0.05)]).double()[None]  # [1, d]
    c_q = (u * lam.unsqueeze(-2)) @ u.transpose(-1, -2)
    keys = torch.randn(4096, heads, d, generator=g)  # isotropic: v_i = 1
    spread = torch.eye(d, dtype=torch.float64)[None]
    a = importance_scale(lam[None], u[None], spread[None])[0]  # [1, d]
    assert torch.allclose(a.square().mean(), torch.tensor(1.0)) and a[0, 0] > 3 * a[0, -1]
    rot = compose(u.float(), "uhp")
    forward, inverse = scaled_transform(u, a, rot)
    plain = TensorCodec(2, d, rot, torch.zeros(heads, d))
    scaled = TensorCodec(2, d, forward, torch.zeros(heads, d), inverse=inverse)
    error = key_objective(c_q)
    e_plain, e_scaled = error(torch.stack([c.fake(keys) - keys for c in (plain, scaled)])).tolist()
    assert e_scaled < 0.6 * e_plain


def test_variants_share_statistics_and_match_single_runs(loaded):
    """calibrate_variants solves each config from one pass; each equals its own calibrate()."""
    from oscarkv.calibrate.run import calibrate_variants

    cfgs = {"a": CFG, "b": replace(CFG, rotation="h", center=False)}
    both = calibrate_variants(loaded, cfgs, [text()])
    for name, cfg in cfgs.items():
        alone, _ = calibrate(loaded, cfg, [text()])
        for key, tensor in alone.tensors.items():
            assert torch.allclose(both[name][0].tensors[key], tensor, atol=1e-6), (name, key)
        assert both[name][0].manifest["clip"] == alone.manifest["clip"]
    with pytest.raises(ValueError, match="data options"):
        calibrate_variants(loaded, {"a": CFG, "b": replace(CFG, tokens=64)}, [text()])


def retrieval_reference(q: torch.Tensor, k: torch.Tensor, sink: int, distance: int) -> torch.Tensor:
    """``C_Q`` per KV head with retrieval weights, in float64 from one sequence's ``q [1, Hq, T, d]``,
    ``k [1, Hkv, T, d]``: ``w = max p`` over the keys ``sink ≤ j ≤ t − distance``, ``ŵ = w / mean w``
    over the group's rows, ``(1/T) Σ_t Σ_g ŵ qᵀq``."""
    q, k = q[0].double(), k[0].double().repeat_interleave(REP, 0)  # [Hq, T, d]
    t = q.shape[1]
    j, i = torch.arange(t)[None, :], torch.arange(t)[:, None]
    p = torch.softmax((q @ k.transpose(1, 2) * D**-0.5).masked_fill(j > i, float("-inf")), -1)  # [Hq, T, T]
    w = torch.where((j >= sink) & (j <= i - distance), p, 0.0).amax(-1).reshape(HKV, REP * t)  # [Hkv, G·T]
    w = w / w.mean(1, keepdim=True)
    qs = q.reshape(HKV, REP * t, D)
    return torch.einsum("hn,hnd,hne->hde", w, qs, qs) / t


def test_retrieval_weighting_matches_hand_computed_reference(loaded):
    batches = chunks(1, seed=3)
    col = StatsCollector(L, HKV, D, query_weighting="retrieval", sink=2, distance=8)
    run_forward(loaded.model, batches, col, "test")
    weighted, uniform = col.finalize(), collect(loaded.model, batches).finalize()
    ref = manual_qkv(loaded.model, batches)
    for i in range(L):
        want = retrieval_reference(ref[i]["q"][0], ref[i]["k"][0], sink=2, distance=8)
        assert torch.allclose(weighted.c_q[i], want, rtol=1e-4, atol=1e-6)
        assert (weighted.c_q[i] - uniform.c_q[i]).abs().max() > 1e-2 * uniform.c_q[i].abs().max()
    for name in ("c_s", "c_k", "c_v", "key_mean", "value_mean"):  # only C_Q (and the proxy) is weighted
        assert torch.equal(getattr(weighted, name), getattr(uniform, name)), name


def test_retrieval_scores_count_only_far_keys_past_the_sink(monkeypatch):
    import oscarkv.calibrate.stats as st

    q, k = torch.randn(2, HQ, 300, D), torch.randn(2, HKV, 300, D)
    w = st.retrieval_scores(q, k, D**-0.5, sink=3, distance=10)  # [B, Hq, T], blocks of SCORE_ROWS rows
    assert w.shape == (2, HQ, 300) and (w[..., :13] == 0).all() and (w[..., 13:] > 0).all() and (w <= 1).all()
    monkeypatch.setattr(st, "SCORE_ROWS", 1000)  # one block: the same scores
    assert torch.allclose(st.retrieval_scores(q, k, D**-0.5, sink=3, distance=10), w, atol=1e-7)


def test_query_weighting_option_is_validated_and_recorded(loaded):
    with pytest.raises(ValueError, match="query_weighting must be one of"):
        CalibrationConfig(query_weighting="sharp")
    assert "query_weighting" not in CalibrationConfig().options()  # the shipped recipe's manifest is unchanged
    assert CalibrationConfig(query_weighting="retrieval").options()["query_weighting"] == "retrieval"
    with pytest.raises(ValueError, match="chunks must be longer"):  # 32-token chunks have no far keys
        calibrate(loaded, replace(CFG, query_weighting="retrieval"), [text()])
