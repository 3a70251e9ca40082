"""Decode steps that take the un-roped qkv projection (``StepContext.attention_from_qkv``): a backend
that fuses QK-norm + RoPE with its key and query maps (``AttentionBackend.decode_qk``; the Triton
one for OSCAR keys, ``oscarkv.kernels.fused.qk_norm_rope_map``) gives the step of the model's
own path (``qk_norm_rope_`` in place, then ``StepContext.attention``) up to the fp32 summation
order of the maps; backends and steps that do not fuse decline and touch nothing.

Any device: the model's CUDA-path wiring (``Attention._attention_fused``) is called directly
(Triton's interpreter on the CPU). GPU: whole engines, fused against unfused, with CUDA graphs."""

import pytest
import torch

from oscarkv.cache.kv_pools import KVPools, PoolGeometry
from oscarkv.cache.paged_layout import PageTables
from oscarkv.attention.backends import TorchAttention
from oscarkv.attention.step import LayerStorage, QKRope, StepContext
from oscarkv.engine.engine import LLMEngine
from oscarkv.attention.backends import TritonAttention
from oscarkv.kernels.fused import qk_norm_rope_map
from oscarkv.models.llama import Attention
from oscarkv.quant.codec import TensorCodec
from tests.engine.conftest import HKV, engine_config, make_artifact, prompts, run, tiny_config, tiny_model
from tests.engine.test_gpu_engine import _compare_prefix

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
P, D = 8, 64


class _DecodeTorch(TorchAttention):
    """The PyTorch oracles with decode steps: never fuses (the model applies QK-norm and RoPE)."""

    decode_steps = True


class _FusedDecodeTorch(_DecodeTorch):
    """Fuses as ``TritonAttention.decode_qk`` does, on any device (the kernel, under the interpreter on the CPU)."""

    def decode_qk(self, st, x, rope):
        return qk_norm_rope_map(x, rope.num_q, rope.q_weight, rope.k_weight, rope.cos, rope.sin, rope.eps,
                                (*st.decode_maps, st.key.mean))


class _FusedExtendTorch(_FusedDecodeTorch):
    """Also fuses extend steps of up to 16 tokens, as ``TritonAttention`` does (``fused_extend_tokens``)."""

    fused_extend_tokens = 16


class _Unfused(TritonAttention):
    """The maps as separate launches. Queries of extend steps in fp32, as the fused kernel maps them (the engine's
    unfused path, past ``fused_extend_tokens``, maps them on the tensor cores in bf16: one more rounding)."""

    def decode_qk(self, st, x, rope):
        return None

    def extend_queries(self, st, q):
        return st.rotate_queries(q, keep_dtype=True)


def _storage(seed: int) -> LayerStorage:
    """A random OSCAR layer: orthogonal key rotation and mean; values centred only (rotation folded)."""
    g = torch.Generator().manual_seed(seed)
    rot = torch.linalg.qr(torch.randn(HKV, D, D, generator=g))[0]
    key = TensorCodec(2, D, rot, 0.3 * torch.randn(HKV, D, generator=g), 0.9)
    return LayerStorage(key, TensorCodec(2, D, None, 0.3 * torch.randn(HKV, D, generator=g), 1.0)).to(DEV)


def _pools(seed: int) -> KVPools:
    pools = KVPools(PoolGeometry(1, HKV, D, D, P, torch.bfloat16, 6, 2), DEV)
    g = torch.Generator().manual_seed(seed)
    pools.bf16_k.copy_(torch.randn(pools.bf16_k.shape, generator=g))
    pools.bf16_v.copy_(torch.randn(pools.bf16_v.shape, generator=g))
    return pools


def _step(backend, pools: KVPools, st: LayerStorage, decode: bool = True) -> StepContext:
    """Two sequences of 11 and 5 tokens (BF16 pages [1, 2] and [3]), the last one this step's."""
    ints = dict(dtype=torch.int32, device=DEV)
    tables = PageTables(torch.tensor([[1, 2], [3, 0]], **ints), torch.tensor([11, 5], **ints),
                        torch.zeros(2, 0, **ints), torch.zeros(2, **ints))
    return StepContext(backend, pools, [st], tables, torch.tensor([0, 1, 2], **ints),
                       torch.tensor([2 * P + 2, 3 * P + 4], **ints), D ** -0.5, decode)


def _layer(norm: bool, rep: int) -> Attention:
    arch = "Qwen3ForCausalLM" if norm else "LlamaForCausalLM"
    attn = Attention(tiny_config(arch, num_attention_heads=HKV * rep, head_dim=D), 0)
    if norm:
        with torch.no_grad():
            for m in (attn.q_norm, attn.k_norm):
                m.weight.copy_(1 + 0.1 * torch.randn(D))
    return attn.to(DEV, torch.bfloat16)


def _inputs(attn: Attention, seed: int) -> tuple[torch.Tensor, QKRope]:
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(2, attn.num_heads + 2 * HKV, D, generator=g) * 2).bfloat16().to(DEV)
    ang = torch.rand(2, D // 2, generator=g) * 100
    emb = torch.cat((ang, ang), -1)
    return qkv, attn._qk_rope(emb.cos().bfloat16().to(DEV), emb.sin().bfloat16().to(DEV))


def test_backends_and_prefill_steps_decline():
    attn = _layer(norm=True, rep=2)
    qkv, rope = _inputs(attn, seed=0)
    st, heads = _storage(0), qkv[:, : attn.num_heads + HKV]
    assert TorchAttention().decode_qk(st, heads, rope) is None
    assert TritonAttention().decode_qk(st, heads.cpu(), rope) is None, "fused on the CPU"
    plain = LayerStorage(TensorCodec(2, D), TensorCodec(2, D))
    assert plain.decode_maps is None and TritonAttention().decode_qk(plain, heads, rope) is None
    for step in (_step(_FusedDecodeTorch(), _pools(0), st, decode=False), _step(_DecodeTorch(), _pools(0), st)):
        before = step.pools.bf16_k.clone()
        assert step.attention_from_qkv(0, qkv, rope) is None
        assert torch.equal(step.pools.bf16_k, before)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("rep", [1, 4])
def test_fused_decode_step_matches_the_model_path(norm, rep):
    """Same output and stored K/V as norm + RoPE in place, then ``attention``; ``qkv`` only read."""
    attn, seed = _layer(norm, rep), 10 * rep + norm
    qkv, rope = _inputs(attn, seed)
    st = _storage(seed)
    fused, ref = _step(_FusedDecodeTorch(), _pools(seed), st), _step(_DecodeTorch(), _pools(seed), st)
    x = qkv.clone()
    out = attn._attention_fused(x, rope, fused)
    assert torch.equal(x, qkv), "the fused path wrote to the qkv projection"
    want = attn._attention_fused(qkv.clone(), rope, ref)
    assert out.dtype == want.dtype == qkv.dtype and out.shape == (2, attn.num_heads, D)  # the model's dtype
    # NOTE: the key map's fp32 summation order may flip the BF16 rounding of a stored key element
    torch.testing.assert_close(fused.pools.bf16_k, ref.pools.bf16_k, rtol=2 ** -7, atol=2 ** -7)
    assert torch.equal(fused.pools.bf16_v, ref.pools.bf16_v)
    assert not torch.equal(fused.pools.bf16_k, _pools(seed).bf16_k), "stored nothing"
    torch.testing.assert_close(out, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("rep", [1, 4])
def test_fused_short_extend_step_matches_the_model_path(rep):
    """An extend step of at most ``fused_extend_tokens`` tokens (a verify step) takes the fused maps: the same
    output and stored K/V as the model's path through ``attention``; a longer one declines and touches nothing."""
    attn, seed = _layer(True, rep), 7 + rep
    qkv, rope = _inputs(attn, seed)
    st = _storage(seed)
    fused, ref = (_step(b, _pools(seed), st, decode=False) for b in (_FusedExtendTorch(), _DecodeTorch()))
    out = attn._attention_fused(qkv.clone(), rope, fused)
    want = attn._attention_fused(qkv.clone(), rope, ref)
    torch.testing.assert_close(fused.pools.bf16_k, ref.pools.bf16_k, rtol=2 ** -7, atol=2 ** -7)
    assert torch.equal(fused.pools.bf16_v, ref.pools.bf16_v)
    assert not torch.equal(fused.pools.bf16_k, _pools(seed).bf16_k), "stored nothing"
    torch.testing.assert_close(out.to(want.dtype), want, rtol=1e-2, atol=1e-2)
    short = _FusedExtendTorch()
    short.fused_extend_tokens = 1  # the step has 2 tokens
    step = _step(short, _pools(seed), st, decode=False)
    assert step.attention_from_qkv(0, qkv, rope) is None and torch.equal(step.pools.bf16_k, _pools(seed).bf16_k)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_fused_engine_matches_unfused_gpu(arch, cuda_graphs):
    """Whole engines on the Triton backend, with and without the fusion: the same greedy tokens up to a
    near-tie (the two differ by fp32 summation orders only, in the maps and the QK-norm)."""
    model = tiny_model(arch).to("cuda", torch.bfloat16)
    art = make_artifact(model.config)
    calls = []

    class Spy(TritonAttention):
        def decode_qk(self, st, x, rope):
            qk = super().decode_qk(st, x, rope)
            calls.append(qk is not None)
            return qk

    ps = prompts(3, 45)
    engines = [LLMEngine.from_hf(model, engine_config("oscar"), art, backend=b, cuda_graphs=cuda_graphs)
               for b in (Spy(), _Unfused())]
    out, ref = (run(e, ps) for e in engines)
    assert calls and all(calls), "a decode step did not take the fused path"
    _compare_prefix(ref, out, 2e-2)
