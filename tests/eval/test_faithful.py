"""Decode-faithful attention against a brute-force per-query reference."""

import pytest
import torch
from types import SimpleNamespace

from oscarkv.config import KVConfig
from oscarkv.eval.faithful import faithful_attention, stored_versions
from oscarkv.quant.bpe import history_end
from oscarkv.quant.codec import build_codec


def brute_force(q, k, v, codec, scaling):
    """For each query i: keys/values as stored when the sequence holds i + 1 tokens."""
    c, layer = codec.config, codec.layers[0]
    k_low, k_bf = stored_versions(layer.key, k, c.page_size)
    v_low, v_bf = stored_versions(layer.value, v, c.page_size)
    rep = q.shape[1] // k.shape[1]
    T = k.shape[2]
    out = torch.zeros(q.shape[0], q.shape[1], T, q.shape[3])
    for i in range(T):
        h = history_end(i + 1, c.sink, c.recent, c.page_size)
        # key j < i: sink and recent from the BF16 store, history from the codes; j == i exact
        pick_k = [k_low[:, :, j] if c.sink <= j < h else k_bf[:, :, j] for j in range(i)] + [k[:, :, i].float()]
        pick_v = [v_low[:, :, j] if c.sink <= j < h else v_bf[:, :, j] for j in range(i)] + [v[:, :, i].float()]
        ks = torch.stack(pick_k, 2).repeat_interleave(rep, 1)
        vs = torch.stack(pick_v, 2).repeat_interleave(rep, 1)
        p = torch.softmax(q[:, :, i:i + 1].float() @ ks.transpose(-1, -2) * scaling, -1)
        out[:, :, i] = (p @ vs)[:, :, 0]
    return out.transpose(1, 2)


@pytest.mark.parametrize("method,sink,recent,page", [
    ("naive", 4, 8, 4), ("quarot", 0, 0, 1), ("kivi", 4, 8, 8), ("int4", 3, 5, 2), ("kivi", 0, 0, 8),
])
def test_matches_brute_force(method, sink, recent, page):
    torch.manual_seed(0)
    B, Hq, Hkv, T, d = 2, 4, 2, 37, 16
    q, k, v = torch.randn(B, Hq, T, d), torch.randn(B, Hkv, T, d) * 2, torch.randn(B, Hkv, T, d)
    codec = build_codec(KVConfig(method, sink, recent, page), 1, Hkv, d)
    module = SimpleNamespace(layer_idx=0)
    out, _ = faithful_attention(module, q, k, v, None, scaling=d**-0.5, oscar_codec=codec)
    assert torch.allclose(out, brute_force(q, k, v, codec, d**-0.5), atol=1e-5)


@pytest.mark.parametrize("method", ["naive", "kivi", "quarot"])
def test_faithful_pass_equals_token_by_token_decode(method):
    """The one-pass simulation gives the logits of decoding one token at a time through OscarCache."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from oscarkv.cache.hf_cache import OscarCache
    from oscarkv.eval.faithful import faithful_logits

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=97)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    codec = build_codec(KVConfig(method, sink=4, recent=8, page_size=4), 2, 2, 16)
    ids = torch.randint(0, 97, (1, 40))
    one_pass = faithful_logits(model, ids, codec)
    cache = OscarCache.from_codec(codec)
    with torch.inference_mode():
        steps = [model(ids[:, i:i + 1], cache=cache, use_cache=True).logits for i in range(ids.shape[1])]
    assert torch.allclose(one_pass, torch.cat(steps, 1), atol=1e-4)
