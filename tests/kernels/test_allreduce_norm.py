"""The fused one-shot all-reduce + residual + RMSNorm (``oscarkv.kernels.allreduce_norm``) in Triton's interpreter:
the other ranks are local tensors that have already written their slot and flagged this rank's pad, so one rank's
call runs alone. Checks the sum (rank order, fp32, rounded to bf16), the residual and norm (``rms_norm``'s
arithmetic, against PyTorch; within a bf16 step: the interpreter truncates its casts to bf16), the flags (one per row,
set on every peer, consumed on its own pad), each row's slot parity, and that a second call uses the other slot. Concurrency and memory ordering need GPUs: ``lab/scripts/tp_ar_norm_check.py``."""

import pytest
import torch

from oscarkv.kernels.allreduce_norm import PeerBuffers, all_reduce_rms_norm
from tests.sm90_subprocess import compile_sm90


def _oracle(parts: list[torch.Tensor], residual: torch.Tensor, w: torch.Tensor, eps: float):
    total = torch.stack([p.float() for p in parts]).sum(0).bfloat16()
    s = (total.float() + residual.float()).bfloat16()
    h = s.float() * torch.rsqrt(s.float().pow(2).mean(-1, keepdim=True) + eps)
    return (w.float() * h.bfloat16().float()).bfloat16(), s


class Ranks:
    """``world`` ranks' buffers (two slots each) and signal pads as local tensors."""

    def __init__(self, world: int, slot_elems: int) -> None:
        self.world, self.slot = world, slot_elems
        self.bufs = [torch.zeros(2 * slot_elems, dtype=torch.bfloat16) for _ in range(world)]
        self.pads = [torch.zeros(world * 8, dtype=torch.int32) for _ in range(world)]  # flag t·world + r
        self.parity = [torch.zeros(8, dtype=torch.int32) for _ in range(world)]  # a row's slot
        self.failed = [torch.zeros(1, dtype=torch.int32) for _ in range(world)]

    def peers(self, rank: int) -> PeerBuffers:
        ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.int64)  # noqa: E731
        return PeerBuffers(ptrs(self.bufs), ptrs(self.pads), self.parity[rank], self.failed[rank], rank, self.world,
                           self.slot)

    def others_arrive(self, rank: int, parts: list[torch.Tensor], slot: int) -> None:
        """Every other rank wrote its partial into ``slot`` and flagged ``rank``'s pad."""
        for r, x in enumerate(parts):
            if r != rank:
                self.bufs[r][slot * self.slot:slot * self.slot + x.numel()] = x.flatten()
                for t in range(len(x)):
                    self.pads[rank][t * self.world + r] = 1


@pytest.mark.parametrize("world,rank,rows,n", [(2, 0, 3, 96), (2, 1, 1, 128), (4, 2, 2, 64)])
def test_one_rank_sums_adds_and_normalizes(world, rank, rows, n):
    g, eps = torch.Generator().manual_seed(world * 10 + rank), 1e-6
    ranks = Ranks(world, slot_elems=8 * n)
    w = (1 + 0.1 * torch.randn(n, generator=g)).bfloat16()
    for call in range(2):  # the second call reads and writes the other slot
        parts = [torch.randn(rows, n, generator=g).bfloat16() for _ in range(world)]
        residual = torch.randn(rows, n, generator=g).bfloat16()
        ranks.others_arrive(rank, parts, slot=call % 2)
        out, res = all_reduce_rms_norm(parts[rank], residual, w, eps, ranks.peers(rank))
        want_out, want_res = _oracle(parts, residual, w, eps)
        for got, want in ((res, want_res), (out, want_out)):  # NOTE: the interpreter truncates casts to bf16
            torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -6, atol=2 ** -7 * want.abs().max().item())
        own = ranks.bufs[rank][call % 2 * ranks.slot:][:rows * n].view(rows, n)
        assert torch.equal(own, parts[rank]), "this rank's partial is not in its slot"
        assert ranks.parity[rank][:rows].tolist() == [(call + 1) % 2] * rows and ranks.parity[rank][rows:].sum() == 0
        assert ranks.pads[rank].sum().item() == 0, "a peer's flag was not consumed"
        flagged = [ranks.pads[p][t * world + rank].item() for p in range(world) if p != rank for t in range(rows)]
        assert flagged == [1] * len(flagged), "a peer was not flagged for every row"
        for p in range(world):  # the peers consume this rank's flags in their own calls
            ranks.pads[p].zero_()


def test_refuses_what_a_slot_cannot_hold():
    ranks = Ranks(2, slot_elems=64)
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="slot"):
        all_reduce_rms_norm(x, x.clone(), torch.ones(64, dtype=torch.bfloat16), 1e-6, ranks.peers(0))


def test_kernel_compiles_for_sm90_with_system_scope_atomics():
    """Triton's bundled ptxas builds the kernel for an H100 here (no GPU), with release / acquire compare-and-swaps at
    system scope (the peers are other GPUs). In a process of its own (``tests.sm90_subprocess``)."""
    pytest.importorskip("triton")
    code = """
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import MockTensor, create_function_from_signature
from oscarkv.kernels.allreduce_norm import _ar_rms_norm_kernel as fn
def build():  # Triton's own binder on stand-in tensors, as lab/benchmarks/compile_sm90.py does
    target = GPUTarget("cuda", 90, 32)
    backend, opts, bf = make_backend(target), {"num_warps": 4}, MockTensor(torch.bfloat16)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    args = ((MockTensor(torch.int64), MockTensor(torch.int64), MockTensor(torch.int32), MockTensor(torch.int32), 65536, 3), (bf, 4096),
            (bf, bf, 4096), bf, (bf, 4096), 1e-6, 4096)
    bound, spec, _ = binder(*args, WORLD=4, BLOCK=4096, SPIN=1 << 22)
    _, sig, cx, attrs = fn._pack_args(backend, opts, bound, spec, None)
    return triton.compile(ASTSource(fn, sig, cx, attrs), target=target, options=opts)
"""
    got = compile_sm90(code)
    ptx = got["ptx"]
    assert "atom.release.sys" in ptx.replace(".global", "") and "atom.acquire.sys" in ptx.replace(".global", ""), \
        [line for line in ptx.splitlines() if "atom" in line][:6]
    assert got["cubin"]


def test_a_peer_that_never_answers_ends_the_wait(monkeypatch):
    """A dead peer (its flag never comes): the wait gives up after ``SPIN_TRIES`` tries, marks ``failed``, and the
    calls after it no longer wait (so a dead worker cannot leave a kernel spinning on a GPU forever)."""
    from oscarkv.kernels import allreduce_norm

    monkeypatch.setattr(allreduce_norm, "SPIN_TRIES", 20)
    ranks, n = Ranks(2, slot_elems=64), 64
    x = torch.ones(1, n, dtype=torch.bfloat16)
    out, res = all_reduce_rms_norm(x, torch.zeros_like(x), torch.ones(n, dtype=torch.bfloat16), 1e-6, ranks.peers(0))
    assert ranks.failed[0].item() == 1 and ranks.pads[1][0].item() == 1  # arrived at the peer, waited in vain
    ranks.pads[1].zero_()
    all_reduce_rms_norm(x, torch.zeros_like(x), torch.ones(n, dtype=torch.bfloat16), 1e-6, ranks.peers(0))
    assert ranks.pads[1].sum().item() == 0, "a call after the failure still signalled the dead peer"
