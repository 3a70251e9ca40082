"""The paged model: weights load from transformers, value folding is exact, shapes build."""

import pytest
import torch

from oscarkv.config import KVConfig
from oscarkv.models.folding import fold_values, permute_kv_heads
from oscarkv.models.llama import PagedLM
from oscarkv.quant.codec import TensorCodec
from tests.engine.conftest import make_artifact, tiny_model


class DenseStep:
    """Causal attention over the given chunk only, values mapped through the storage codec."""

    def __init__(self, values: list[TensorCodec]) -> None:
        self.values = values

    def attention(self, layer, q, k, v):
        v = self.values[layer].to_rotated(v).to(q.dtype) if self.values else v
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        att = torch.einsum("thd,shd->hts", q, k) * q.shape[-1] ** -0.5
        att = att.masked_fill(~torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).tril(), float("-inf"))
        return torch.einsum("hts,shd->thd", att.softmax(-1), v)


@pytest.mark.parametrize("scaled", [False, True])
def test_folded_values_equal_unfolded_fp64(scaled):
    """Folding is exact for an orthogonal R_V and for an importance-scaled (non-orthogonal) one."""
    hf = tiny_model("Qwen3ForCausalLM").double()
    art = make_artifact(hf.config)
    if scaled:
        shape = art.tensors["value.mean"].shape
        art.tensors["value.scale"] = torch.rand(shape, generator=torch.Generator().manual_seed(2)) + 0.5
    codec = art.codec(KVConfig("oscar", group_size=32), 32)
    ids, pos = torch.randint(0, 128, (17,)), torch.arange(17)
    plain = PagedLM.from_hf(hf)
    ref = plain.compute_logits(plain(ids, pos, DenseStep([])))
    folded = PagedLM.from_hf(hf)
    values = fold_values(folded, codec.layers)
    assert values[0].rotation is None and values[0].mean is not None
    out = folded.compute_logits(folded(ids, pos, DenseStep(values)))
    # fp64 model; the artifact's rotations are fp32 (orthogonal to ~1e-7), hence not 1e-12
    assert (out - ref).abs().max() < 1e-5 * ref.abs().max()


def test_folding_one_model_twice(caplog):
    """Folding is in place: a second engine built from the same PagedLM and artifact folds nothing again (two OSCAR
    engines of one model gave different tokens in a lab script, 2026-11-28); other maps over folded ones warn."""
    hf = tiny_model("Qwen3ForCausalLM")
    art = make_artifact(hf.config)
    codec = art.codec(KVConfig("oscar", group_size=32), 32)
    once, twice = PagedLM.from_hf(hf), PagedLM.from_hf(hf)
    fold_values(once, codec.layers)
    with caplog.at_level("WARNING", logger="oscarkv.models.folding"):
        fold_values(twice, codec.layers)
        fold_values(twice, art.codec(KVConfig("oscar", group_size=32), 32).layers)  # equal maps, other tensors
        assert "folded already" not in caplog.text
        assert all(torch.equal(a, b) for a, b in zip(once.state_dict().values(), twice.state_dict().values()))
        art.tensors["value.mean"] = art.tensors["value.mean"] + 1
        fold_values(twice, art.codec(KVConfig("oscar", group_size=32), 32).layers)
    assert "folded already" in caplog.text and "copy.deepcopy" in caplog.text


def test_permuting_heads_again_reaches_the_order_asked():
    """``permute_kv_heads`` names heads as loaded: the same order twice is the order once; another order after it is
    that order from the loaded weights."""
    hf = tiny_model("Qwen3ForCausalLM")
    attn = [PagedLM.from_hf(hf).model.layers[0].self_attn for _ in range(3)]
    permute_kv_heads(attn[0], [1, 0])
    permute_kv_heads(attn[1], [1, 0])
    permute_kv_heads(attn[1], [1, 0])
    def same(a, b):
        return torch.equal(a.qkv_proj.weight, b.qkv_proj.weight) and torch.equal(a.o_proj.weight, b.o_proj.weight)
    assert same(attn[0], attn[1]) and not same(attn[1], attn[2])
    permute_kv_heads(attn[1], [0, 1])
    assert same(attn[1], attn[2])


def test_from_hf_matches_transformers_dense():
    for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        hf = tiny_model(arch)
        ids = torch.randint(0, 128, (13,))
        ours = PagedLM.from_hf(hf)
        with torch.no_grad():
            got = ours.compute_logits(ours(ids, torch.arange(13), DenseStep([])))
            want = hf(ids[None]).logits[0]
        assert (got - want).abs().max() < 1e-4, arch


def test_random_init_at_real_shapes_is_cheap_on_meta():
    from oscarkv.models.shapes import SHAPES, shape_config

    for name in SHAPES:
        config = shape_config(name)
        model = PagedLM.random(config, dtype=torch.bfloat16, device="meta")
        n = sum(p.numel() for p in model.parameters())
        if name == "smollm2-135m":  # the default model's geometry: a Llama, no QK-norm, tied embeddings
            assert round(n / 1e6, 1) == 134.5 and model.model.layers[0].self_attn.q_norm is None
        else:
            assert n > 3e9 and model.model.layers[0].self_attn.q_norm is not None
