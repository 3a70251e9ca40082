"""Weight prefetch into L2 (``EngineConfig.l2_prefetch``): which bytes each projection prefetches, when it
issues them, the flag's errors, and the kernel compiled for an H100 on the CPU."""

import pytest
import torch

from oscarkv.bench.configs import DecodeBench
from oscarkv.config import EngineConfig, prefetch_points
from oscarkv.models import prefetch
from oscarkv.models.llama import PagedLM
from oscarkv.models.parallel import RowParallelLinear
from tests.engine.conftest import tiny_config
from tests.sm90_subprocess import compile_sm90


@pytest.fixture
def model(monkeypatch):
    """A 3-layer PagedLM whose device counts as able to prefetch; issued prefetches are recorded, not run."""
    issued: list[torch.Tensor] = []
    monkeypatch.setattr(prefetch, "_supported", lambda device: True)
    monkeypatch.setattr("oscarkv.kernels.prefetch.l2_prefetch", issued.append)
    m = PagedLM(tiny_config("Qwen3ForCausalLM", num_hidden_layers=3)).eval()
    m.issued = issued
    return m


def _start(t: torch.Tensor) -> int:
    return t.data_ptr()


def test_points_parse_and_name_the_flag():
    assert prefetch_points("off") == () and prefetch_points("all") == ("attn", "reduce", "act", "next")
    assert prefetch_points("attn+next") == prefetch_points("attn, next") == ("attn", "next")
    with pytest.raises(ValueError, match=r"--l2-prefetch.*'attention'"):
        EngineConfig(l2_prefetch="attention")
    with pytest.raises(ValueError, match="--l2-prefetch-mib"):
        EngineConfig(l2_prefetch_mib=0)
    with pytest.raises(ValueError, match="--l2-prefetch"):
        DecodeBench(l2_prefetch=("off", "bogus"))


def test_each_point_holds_the_next_weights_first_bytes(model):
    layers = model.model.layers
    budget = 3000  # below every weight's bytes here: each point holds the first 2992
    total = prefetch.attach(layers, ("attn", "reduce", "act", "next"), budget)
    for i, layer in enumerate(layers):
        a, mlp = layer.self_attn, layer.mlp
        want = [(a.qkv_proj, a.o_proj), (a.o_proj, mlp.gate_up_proj), (mlp.gate_up_proj, mlp.down_proj)]
        if i + 1 < len(layers):
            want.append((mlp.down_proj, layers[i + 1].self_attn.qkv_proj))
        else:
            assert "l2_next" not in mlp.down_proj.__dict__  # the last layer's down_proj: nothing after it
        for src, dst in want:
            t = src.l2_next
            assert t.dtype == torch.uint8 and _start(t) == _start(dst.weight)
            assert t.numel() == min(budget, dst.weight.numel() * dst.weight.element_size()) // 16 * 16
    assert total == sum(m.l2_next.numel() for layer in layers for m in prefetch._projections(layer)
                        if "l2_next" in m.__dict__)
    prefetch.attach(layers, ("attn",), budget)  # attaching again replaces what was there
    assert [("l2_next" in m.__dict__) for m in prefetch._projections(layers[0])] == [True, False, False, False]
    assert prefetch.attach(layers, (), budget) == 0
    assert not any("l2_next" in m.__dict__ for layer in layers for m in prefetch._projections(layer))


def test_forward_issues_each_prefetch_after_its_gemv_and_keeps_outputs(model):
    class Step:  # attention as the CPU oracle computes it would need a cache: causal SDPA over the step's tokens
        def attention(self, layer, q, k, v):
            rep = q.shape[1] // k.shape[1]
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1), k.repeat_interleave(rep, 1).transpose(0, 1), v.repeat_interleave(rep, 1).transpose(0, 1),
                is_causal=True)
            return o.transpose(0, 1)

    ids, pos = torch.tensor([3, 9, 27, 81]), torch.arange(4)
    with torch.no_grad():
        before = model(ids, pos, Step())
        prefetch.attach(model.model.layers, ("attn", "reduce", "act", "next"), 1 << 20)
        after = model(ids, pos, Step())
    assert torch.equal(before, after)
    layers = model.model.layers
    want = []
    for i, layer in enumerate(layers):
        a, mlp = layer.self_attn, layer.mlp
        want += [a.o_proj.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight]
        if i + 1 < len(layers):
            want.append(layers[i + 1].self_attn.qkv_proj.weight)
    assert [_start(t) for t in model.issued] == [_start(w) for w in want]


def test_row_parallel_projection_prefetches_before_its_all_reduce(monkeypatch):
    order: list[str] = []

    class TP:
        def all_reduce(self, x):
            order.append("all-reduce")
            return x

    monkeypatch.setattr("oscarkv.kernels.prefetch.l2_prefetch", lambda t: order.append("prefetch"))
    lin = RowParallelLinear(16, 8, TP())
    lin.l2_next = torch.zeros(32, dtype=torch.uint8)
    lin(torch.ones(2, 16))
    prefetch.after_gemv(lin)  # what Attention / MLP call after it: the module issued its own already
    assert order == ["prefetch", "all-reduce"]


def test_unsupported_device_attaches_nothing():
    m = PagedLM(tiny_config("LlamaForCausalLM")).eval()
    assert prefetch.attach(m.model.layers, ("attn", "next"), 1 << 20) == 0
    assert not any("l2_next" in p.__dict__ for layer in m.model.layers for p in prefetch._projections(layer))


def test_kernel_compiles_for_sm90_with_the_bulk_prefetch():
    """Triton's bundled ptxas builds the kernel for an H100 here (no GPU): the PTX holds the instruction, guarded.
    In a process of its own (``tests.sm90_subprocess``)."""
    pytest.importorskip("triton")
    code = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from oscarkv.kernels.prefetch import CHUNK, LANES, _l2_prefetch_kernel
def build():
    src = ASTSource(fn=_l2_prefetch_kernel, signature={"base": "*u8", "nbytes": "i64", "CHUNK": "constexpr",
                    "LANES": "constexpr"}, constexprs={"CHUNK": CHUNK, "LANES": LANES})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": LANES // 32})
"""
    got = compile_sm90(code)
    assert "@p cp.async.bulk.prefetch.L2.global" in got["ptx"] and "setp.gt.s32" in got["ptx"]
    assert got["cubin"]


def test_bench_decode_times_each_variant_of_each_method():
    from transformers import Qwen3Config

    from oscarkv.bench.decode import variants

    cfg = DecodeBench(methods=("bf16", "oscar"), l2_prefetch=("off", "attn+next"))
    rows = variants(cfg, Qwen3Config(num_hidden_layers=2, num_key_value_heads=2))
    assert [(label, v) for label, _, v in rows] == [("bf16", "off"), ("oscar", "off"), ("bf16 l2=attn+next", "attn+next"),
                                                    ("oscar l2=attn+next", "attn+next")]
