"""Grouped-kernel guard: every GQA group size a model may have (1, 2, 4, 6, 8, 12 query heads per KV head)
against the fp32 oracle, decode and extend. A kernel whose query-head tile does not divide the group could
read another head's rows (REP_PAD > REP: 6 → 8, 12 → 16). CPU interpreter at small shapes; on a GPU the
decode kernel at every CUDA-graph batch bucket (the split count is chosen per bucket) and extend with long
(staged, cuDNN) and short (tile kernel) chunks in one step."""

import pytest
import torch

from oscarkv.attention.backends import TritonAttention
from oscarkv.engine.cuda_graphs import DEFAULT_BUCKETS
from oscarkv.kernels.decode import decode_attention
from oscarkv.kernels.prefill import MIN_CHUNK
from oscarkv.kernels.reference import decode_attention_ref, extend_attention_ref
from oscarkv.kernels.synthetic import random_cache
from tests.kernels.test_decode import _bf16_torch_error, _rel
from tests.kernels.test_extend import _bf16_error

CUDA = torch.cuda.is_available()
GROUPS = (1, 2, 4, 6, 8, 12)


def _decode(lens, rep, h, d, device, seed):
    kv, tables = random_cache(lens, h, d, page=64 if device == "cuda" else 16, sink=64 if device == "cuda" else 32,
                              recent=256 if device == "cuda" else 64, device=device, seed=seed)
    q = torch.randn(len(lens), rep * h, d, generator=torch.Generator(device=device).manual_seed(seed), device=device)
    q = q.bfloat16()
    out = decode_attention(q if device == "cuda" else q.float(), kv, tables, d**-0.5)
    ref = decode_attention_ref(q.float(), kv, tables, d**-0.5)
    tol = max(2 * _bf16_torch_error(q, kv, tables, d**-0.5, ref), 1e-3)
    assert _rel(out, ref) <= tol, (rep, len(lens), _rel(out, ref), tol)


def _extend(cached, chunks, rep, h, d, device, seed):
    kv, tables = random_cache(cached, h, d, page=64 if device == "cuda" else 16, sink=64 if device == "cuda" else 32,
                              recent=256 if device == "cuda" else 64, device=device, seed=seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    t = sum(chunks)
    q, k, v = (torch.randn(t, n, d, generator=gen, device=device).bfloat16().float() for n in (rep * h, h, h))
    cu = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32, device=device)
    out = TritonAttention().extend(q, k, v, kv, tables, cu, d**-0.5)
    ref = extend_attention_ref(q, k, v, kv, tables, cu, d**-0.5)
    tol = max(2 * _bf16_error(q, k, v, kv, tables, cu, d**-0.5, ref), 1e-3)
    assert _rel(out, ref) <= tol, (rep, chunks, _rel(out, ref), tol)


@pytest.mark.skipif(CUDA, reason="interpreter cases run on the CPU")
@pytest.mark.parametrize("rep", GROUPS)
def test_groups_cpu(rep):
    _decode([150, 7], rep, 1, 64, "cpu", seed=rep)
    _extend([120, 0], [3, MIN_CHUNK], rep, 1, 32, "cpu", seed=rep)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("rep", GROUPS)
def test_groups_every_bucket_gpu(rep):
    g = torch.Generator().manual_seed(rep)
    for bucket in DEFAULT_BUCKETS:
        _decode(torch.randint(1, 3000, (bucket,), generator=g).tolist(), rep, 8, 128, "cuda", seed=bucket)
    _extend([5000, 700, 0], [1, 900, 300], rep, 8, 128, "cuda", seed=rep)
