"""``oscarkv bench attention`` on the CPU: the split count it reports is the one the decode kernel runs, and its
table prints each kind's error against the fp32 oracle beside that count."""

import torch

from oscarkv.bench.attention import Row, format_table
from oscarkv.kernels import decode
from oscarkv.kernels.synthetic import random_cache


def test_decode_splits_is_what_the_kernel_launches(monkeypatch):
    seen = []
    monkeypatch.setattr(decode, "merge_splits", lambda mid_o, *args: seen.append(mid_o.shape[2]))
    for batch, int2 in ((1, True), (3, True), (2, False)):
        kv, tables = random_cache([300] * batch, 2, 64, page=16, int2=int2, seed=batch)
        decode.decode_attention(torch.randn(batch, 8, 64), kv, tables, 0.125)
        assert seen[-1] == decode.decode_splits(kv, batch, torch.device("cpu"))
        assert decode.decode_splits(kv, batch, torch.device("cpu"), {"MAX_SPLITS": 1}) == 1


def test_table_prints_errors_and_splits():
    rows = [Row(102400, 1, us={"bf16": 100.0, "int2": 40.0}, gbps={"bf16": 4000.0, "int2": 2000.0},
                err={"bf16": 2.2e-3, "int2": 1.8e-3}, splits={"bf16": 33, "int2": 198}),
            Row(102400, 32, us={"int2": 700.0}, gbps={"int2": 3000.0}, err={"int2": 1.5e-2}, splits={"int2": 6})]
    table = format_table(rows, 4800.0)
    assert "bf16 2.2e-03 (33)  int2 1.8e-03 (198)" in table and "int2 1.5e-02 (6)" in table
