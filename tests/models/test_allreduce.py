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


class _OneRankReduce:
    """A ``one_shot_norm`` all-reduce of one rank: its peers are local tensors (no flags to wait for), so the fused
    kernel runs in Triton's interpreter (``oscarkv.kernels.allreduce_norm``; several ranks need GPUs)."""

    kind = "one_shot_norm"

    def __init__(self, rows: int, width: int) -> None:
        from oscarkv.kernels.allreduce_norm import PeerBuffers

        self.buf, self.pad = torch.zeros(2 * rows * width, dtype=torch.bfloat16), torch.zeros(rows, dtype=torch.int32)
        table = lambda t: torch.tensor([t.data_ptr()], dtype=torch.int64)  # noqa: E731
        self.peers = PeerBuffers(table(self.buf), table(self.pad), torch.zeros(rows, dtype=torch.int32),
                                 torch.zeros(1, dtype=torch.int32), 0, 1, rows * width)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_one_shot_norm_defers_the_sum_to_the_next_norm():
    """``one_shot_norm`` in a Llama-style shard: ``o_proj`` / ``down_proj`` leave partial sums for the messages
    the buffer holds (a decision of the shape alone), the norms after them sum, add and normalize in one kernel
    (equal to ``rms_norm`` of the sum here, one rank), layer 0's norm (embeddings, no residual) never does; a
    Gemma 3 shard (norms after the residual add) keeps plain all-reduces."""
    from oscarkv.kernels.fused import rms_norm
    from oscarkv.models.parallel import ReducingRMSNorm, TensorParallel, sharded_model
    from tests.engine.conftest import tiny_config

    cfg = tiny_config()
    d, rows = cfg.hidden_size, 4
    tp = TensorParallel(0, 1, None, _OneRankReduce(rows, d))
    model = sharded_model(cfg, tp, torch.bfloat16, "cpu")
    layer = model.model.layers[1]
    assert layer.self_attn.o_proj.defer and layer.mlp.down_proj.defer
    assert all(isinstance(n, ReducingRMSNorm) for n in (layer.input_layernorm, layer.post_attention_layernorm,
                                                        model.model.norm))
    g = torch.Generator().manual_seed(3)
    x, res = (torch.randn(rows, d, generator=g).bfloat16() for _ in range(2))
    with torch.no_grad():
        layer.input_layernorm.weight.copy_(1 + 0.1 * torch.randn(d, generator=g))
    assert tp.fuses(x) and not tp.fuses(torch.zeros(rows + 1, d, dtype=torch.bfloat16))
    assert not tp.fuses(x.float()) and not tp.fuses(torch.zeros(rows, 2 * d, dtype=torch.bfloat16)[:, ::2])
    got = layer.input_layernorm.add_norm(x, res)
    want = rms_norm(x, layer.input_layernorm.weight, layer.input_layernorm.eps, res)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -6, atol=2 ** -6)
    assert tp.reduce.peers.parity[:rows].tolist() == [1] * rows  # the fused kernel ran (a slot per row)
    emb = layer.input_layernorm.add_norm(x, None)  # layer 0's input: the embeddings, whole already
    torch.testing.assert_close(emb[0].float(), rms_norm(x, layer.input_layernorm.weight, 1e-6)[0].float())
    gemma = sharded_model(tiny_config("Gemma3ForCausalLM"), tp, torch.bfloat16, "cpu")
    assert not gemma.model.layers[0].self_attn.o_proj.defer
