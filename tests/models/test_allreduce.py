"""The all-reduce choice (``oscarkv.models.allreduce``): what each configured kind becomes, and the errors.

The sums themselves are checked end to end: the CPU tensor-parallel tests (gloo, tokens equal tp = 1) and
the GPU ones for each kind (``lab/scripts/gpu_tp_speed.sh``).
"""

import pytest
import torch

from oscarkv.config import EngineConfig
from oscarkv.models import allreduce
from oscarkv.models.allreduce import choose

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def test_cpu_is_the_group_backend():
    assert choose("auto", 2, CPU) == choose("nccl", 4, CPU) == "nccl"
    for kind in ("one_shot", "two_shot"):
        with pytest.raises(ValueError, match="needs CUDA"):
            choose(kind, 2, CPU)


def test_auto_follows_the_measured_table(monkeypatch):
    monkeypatch.setattr(allreduce, "SYMM_MEM_WINS", {})
    assert choose("auto", 2, CUDA) == "nccl"
    monkeypatch.setattr(allreduce, "SYMM_MEM_WINS", {2: "one_shot"})
    has_op = hasattr(torch.ops.symm_mem, allreduce.SYMM_MEM_OPS["one_shot"])
    assert choose("auto", 2, CUDA) == ("one_shot" if has_op else "nccl")  # NOTE: a CPU build of torch has none
    assert choose("auto", 4, CUDA) == "nccl" and choose("two_shot", 2, CUDA) == "two_shot"
    with pytest.raises(ValueError, match="2, 4 or 8"):
        choose("two_shot", 3, CUDA)


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="tensor_parallel_all_reduce"):
        EngineConfig(tensor_parallel_all_reduce="multimem")
    with pytest.raises(ValueError, match="one of"):
        choose("multimem", 2, CUDA)


def test_symmetric_memory_once_per_engine_process(monkeypatch):
    """A second symmetric-memory engine in one process is refused (torch's rendezvous counter is per process:
    its fresh workers would wait forever); ``auto`` then takes NCCL; a first one, or NCCL, goes through."""
    monkeypatch.setattr(allreduce, "SYMM_MEM_WINS", {2: "one_shot"})
    for kind in ("one_shot", "two_shot"):
        assert choose(kind, 2, CUDA, rendezvoused=False) == kind
        with pytest.raises(RuntimeError, match="its own process"):
            choose(kind, 2, CUDA, rendezvoused=True)
    assert choose("auto", 2, CUDA, rendezvoused=True) == "nccl"
    assert choose("nccl", 2, CUDA, rendezvoused=True) == "nccl"
    monkeypatch.setattr(allreduce, "_rendezvous_done", [1])
    with pytest.raises(RuntimeError, match="its own process"):
        allreduce.resolve("one_shot", 2, CUDA)
    monkeypatch.setattr(allreduce, "_rendezvous_done", [0])
    assert allreduce.resolve("two_shot", 4, CUDA) == "two_shot"


@pytest.mark.parametrize("rows", [1, 3, 8, 64, 65])
def test_symm_path_is_a_function_of_the_message(rows):
    """Which path a message takes depends on its size, dtype and layout only (so every rank takes the same):
    decode rows through the buffer, anything larger, of another dtype, strided or unaligned through NCCL."""
    d, cap = 4096, 64 * 4096
    x = torch.zeros(rows, d, dtype=torch.bfloat16)
    fits = rows * d <= cap
    assert allreduce.symm_path(x.numel(), x.dtype, x.is_contiguous(), torch.bfloat16, cap) == fits
    assert not allreduce.symm_path(x.numel(), torch.float32, True, torch.bfloat16, cap)
    strided = torch.zeros(rows, 2 * d, dtype=torch.bfloat16)[:, :d]
    assert not allreduce.symm_path(strided.numel(), strided.dtype, strided.is_contiguous(), torch.bfloat16, cap) \
        or rows == 1  # one row of a wider tensor is contiguous
    assert not allreduce.symm_path(4095, torch.bfloat16, True, torch.bfloat16, cap)  # 8190 B: not 16-byte aligned
    assert not allreduce.symm_path(0, torch.bfloat16, True, torch.bfloat16, cap)
