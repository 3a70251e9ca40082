"""The skinny-GEMM probe's Triton kernel (``lab.benchmarks.gemv``) against a plain matmul, and its shape guard."""

from __future__ import annotations

import pytest
import torch

from lab.benchmarks.gemv import projections, skinny

CFG = dict(BLOCK_N=16, BLOCK_K=32, num_warps=4, num_stages=3)
CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("bias", [False, True])
def test_skinny_matches_matmul(rows, bias):
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 96, generator=g), torch.randn(48, 96, generator=g)
    b = torch.randn(48, generator=g) if bias else None
    ref = x @ w.t() + (b if bias else 0)
    if not CUDA:  # the interpreter computes in fp32
        torch.testing.assert_close(skinny(x, w, b, CFG), ref, rtol=1e-5, atol=1e-5)
        return
    # on a GPU the probe's dtype: bf16 operands (rounded before the fp32 reference), fp32 accumulation
    x, w, b = (t.bfloat16().cuda() if t is not None else None for t in (x, w, b))
    ref = x.float() @ w.float().t() + (b.float() if bias else 0)
    torch.testing.assert_close(skinny(x, w, b, CFG).float(), ref, rtol=1e-2, atol=2e-2 * ref.abs().max().item())


def test_skinny_refuses_shapes_it_does_not_tile():
    with pytest.raises(ValueError, match="M=17"):
        skinny(torch.zeros(17, 64), torch.zeros(32, 64), None, CFG)
    with pytest.raises(ValueError, match="K=40"):
        skinny(torch.zeros(1, 40), torch.zeros(32, 40), None, CFG)


def test_projection_shapes():
    """Qwen3-4B: q 32x128 + k, v 8x128 from 2560; o back to 2560 (with the folding bias); MLP 9728."""
    assert projections("qwen3-4b") == {"qkv": (6144, 2560, False), "o": (2560, 4096, True),
                                       "gate_up": (19456, 2560, False), "down": (2560, 9728, False)}
