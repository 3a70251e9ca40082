"""Logits of a tensor-parallel decode graph (``parallel.graph_logits``): each rank forms its share of the
vocabulary rows and rank 0 gathers them, equal to one rank's whole product; two gloo ranks on the CPU.

The graphs themselves (CUDA only) are covered by the GPU tp tests (tokens equal tp = 1).
"""

from datetime import timedelta

import torch
import torch.multiprocessing as mp

from oscarkv.models.llama import PagedLM
from oscarkv.models.parallel import TensorParallel, graph_logits
from tests.engine.conftest import tiny_config


def _model(vocab: int, cap: float | None) -> PagedLM:
    torch.manual_seed(0)
    model = PagedLM(tiny_config(vocab_size=vocab, final_logit_softcapping=cap)).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.5)
    return model


def _rank(rank: int, path: str, cases: list) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    tp = TensorParallel(rank, 2, dist.group.WORLD)
    for vocab, cap in cases:
        model = _model(vocab, cap)
        hidden = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(vocab))
        with torch.inference_mode():
            got, want = graph_logits(model, hidden, tp), model.compute_logits(hidden)
        if rank and got is not None:
            raise SystemExit(2)  # only rank 0 holds logits
        if not rank and not (got.dtype == torch.float32 and torch.equal(got, want)):
            raise SystemExit(3)
    dist.destroy_process_group()


def test_gathered_vocab_equals_whole_head(tmp_path):
    """An even vocabulary (gathered, with and without soft-capping) and an odd one (rank 0 alone)."""
    cases = [(64, None), (64, 5.0), (63, None)]
    child = mp.get_context("spawn").Process(target=_rank, args=(1, str(tmp_path / "rdv"), cases))
    child.start()
    try:
        _rank(0, str(tmp_path / "rdv"), cases)
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0


def test_one_rank_is_the_whole_head():
    model = _model(64, None)
    hidden = torch.randn(2, model.config.hidden_size)
    with torch.inference_mode():
        assert torch.equal(graph_logits(model, hidden, TensorParallel()), model.compute_logits(hidden))
