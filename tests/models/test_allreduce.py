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
