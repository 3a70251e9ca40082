"""``oscarkv bench capacity`` without a GPU: pool sizing per method (oscar included) is the engine's own,
and ``--methods`` parses and refuses what the benchmark cannot run."""

from __future__ import annotations

import argparse

import pytest
import torch

from oscarkv.bench import capacity, e2e
from oscarkv.cli.bench import run as run_bench
from oscarkv.cli.bench import setup as setup_bench
from oscarkv.cli.flags import UserError
from oscarkv.models.llama import PagedLM
from oscarkv.models.shapes import SHAPES, shape_config

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, vocab_size=128, tie_word_embeddings=True)


@pytest.mark.parametrize("n", [2, 16])
def test_tensor_parallel_sizing_is_one_rank_of_the_whole(n):
    """n ranks, each with the budget share of its KV heads, hold the pages and sequences one GPU holds; bytes
    per token are the group's (n = 16 > 8 KV heads: one replicated head per rank, twice the bytes)."""
    heads = max(1, 8 // n)  # qwen3-32b: 8 KV heads
    whole = capacity.fits(capacity.CapacityBench(shape="qwen3-32b", kv_gib=8.0), "naive")
    split = capacity.fits(capacity.CapacityBench(shape="qwen3-32b", kv_gib=8.0 * heads / 8,
                                                 tensor_parallel_size=n), "naive")
    assert (split["tokens"], split["seqs_fit"]) == (whole["tokens"], whole["seqs_fit"]) and whole["seqs_fit"] >= 1
    assert split["bytes_per_token"] == {k: v * n * heads / 8 for k, v in whole["bytes_per_token"].items()}


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="oscarkv bench")
    setup_bench(p)
    return p.parse_args(["capacity", *argv])


@pytest.mark.parametrize("kv_gib", [0.5, 2.0])
def test_oscar_fits_as_naive_and_int2_holds_more_than_bf16(kv_gib):
    cfg = capacity.CapacityBench(kv_gib=kv_gib, context=2048, methods=("bf16", "naive", "oscar"))
    rows = {r["method"]: r for r in capacity.capacity_rows(cfg)}
    oscar = dict(rows["oscar"])
    assert oscar.pop("pools_equal_naive") is True
    assert {**oscar, "method": "naive"} == rows["naive"]
    assert rows["naive"]["tokens"] > rows["bf16"]["tokens"] and rows["bf16"]["int2_tokens"] == 0
    assert rows["naive"]["seqs_fit"] > rows["bf16"]["seqs_fit"] > 0
    table = capacity.format_table(list(rows.values()))
    assert "| oscar |" in table and "oscar pools equal naive's" in table


@pytest.mark.parametrize("method", ["bf16", "naive", "oscar"])
def test_geometry_is_the_engines(monkeypatch, method):
    """The sizing the table reports is what ``e2e.build_engine`` allocates (tiny shape, CPU, bfloat16 model)."""
    monkeypatch.setitem(SHAPES, "tiny", TINY)
    methods = ("bf16",) if method == "bf16" else ("bf16", method)
    cfg = capacity.CapacityBench(shape="tiny", kv_gib=4 / 1024, context=1000, methods=methods)
    chunk, seqs = dict(cfg.chunks)[method], 3
    engine = e2e.build_engine(PagedLM.random(shape_config("tiny"), torch.bfloat16), method,
                              int(cfg.kv_gib * 2**30), seqs, chunk)
    assert engine.runner.pools.geo == capacity.geometry(cfg, method, chunk, seqs)


def test_methods_argument():
    assert _parse().methods == ("bf16", "naive")
    assert _parse("--methods", "bf16,naive,oscar").methods == ("bf16", "naive", "oscar")


def test_unknown_method_is_refused():
    with pytest.raises(UserError, match=r"unknown method\(s\) \['kivi'\]"):
        run_bench(_parse("--methods", "bf16,kivi"))
    with pytest.raises(ValueError, match=r"unknown method\(s\) \['kivi'\]"):
        capacity.CapacityBench(methods=("bf16", "kivi"))


def test_bf16_is_required():
    with pytest.raises(UserError, match="must include 'bf16'"):
        run_bench(_parse("--methods", "naive,oscar"))
    with pytest.raises(ValueError, match="repeated"):
        capacity.CapacityBench(methods=("bf16", "naive", "naive"))
    with pytest.raises(ValueError, match="no bf16 row"):
        capacity.format_table(capacity.capacity_rows(capacity.CapacityBench())[1:])
