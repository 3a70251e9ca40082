"""Rotations: Hadamard, bit reversal, composition and orthogonality."""

import pytest
import torch

from oscarkv.quant.rotation import bit_reversal, compose, eig_desc, hadamard, orthogonality_error, permutation_matrix


@pytest.mark.parametrize("d", [1, 2, 16, 64, 128, 96, 80])
def test_hadamard_orthogonal(d):
    h = hadamard(d)
    assert orthogonality_error(h) < 1e-12
    if d & (d - 1) == 0:
        assert torch.allclose(h.abs(), torch.full((d, d), d**-0.5, dtype=torch.float64))


def test_bit_reversal():
    assert bit_reversal(8).tolist() == [0, 4, 2, 6, 1, 5, 3, 7]
    p = bit_reversal(64)
    assert torch.equal(p[p], torch.arange(64))  # an involution
    x = torch.randn(3, 64, dtype=torch.float64)
    assert torch.equal(x @ permutation_matrix(p), x[:, p])


def test_bit_reversal_spreads_levels_across_groups():
    # Channels in importance order form G levels of d/G consecutive channels; every output
    # group of G channels must take exactly one channel from each level.
    d, g = 128, 32
    p = bit_reversal(d)
    for grp in range(d // g):
        levels = p[grp * g:(grp + 1) * g] // (d // g)
        assert sorted(levels.tolist()) == list(range(g))


def test_eig_desc_and_compose():
    torch.manual_seed(0)
    a = torch.randn(3, 16, 16, dtype=torch.float64)
    c = a @ a.transpose(-1, -2)
    evals, u = eig_desc(c)
    assert (evals[..., :-1] >= evals[..., 1:]).all()
    assert torch.allclose(u @ torch.diag_embed(evals) @ u.transpose(-1, -2), c, atol=1e-9)
    r = compose(u, "uhp")
    assert r.dtype == torch.float32 and orthogonality_error(r) < 1e-5
    expect = u @ hadamard(16) @ permutation_matrix(bit_reversal(16))
    assert torch.allclose(r.double(), expect, atol=1e-6)
    assert torch.allclose(compose(u, "u").double(), u, atol=1e-6)
    assert torch.allclose(compose(u, "h")[0].double(), hadamard(16), atol=1e-6)
    with pytest.raises(ValueError, match="rotation kind"):
        compose(u, "bogus")


def test_rotation_preserves_dot_products():
    torch.manual_seed(0)
    u = torch.linalg.qr(torch.randn(64, 64, dtype=torch.float64))[0]
    r = compose(u, "uhp").double()
    q, k = torch.randn(5, 64, dtype=torch.float64), torch.randn(7, 64, dtype=torch.float64)
    assert torch.allclose((q @ r) @ (k @ r).T, q @ k.T, atol=1e-5)
