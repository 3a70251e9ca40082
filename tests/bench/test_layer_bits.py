"""``oscarkv bench decode --layer-key-bits``: a per-layer allocation carried over to a shape's layers, served by
per-layer pools at the bits asked, with the codec's bits per element and the bytes a step reads (CPU, tiny shape)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3Config

from oscarkv.bench import decode, e2e
from oscarkv.bench.configs import DecodeBench
from oscarkv.bench.layer_bits import allocation_config, even, spread
from oscarkv.config import KVConfig
from oscarkv.engine.request import SamplingParams
from oscarkv.models.llama import PagedLM
from oscarkv.quant.codec import build_codec

L = 6
CONFIG = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=L, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=32, vocab_size=128, max_position_embeddings=1024,
                     architectures=["Qwen3ForCausalLM"])


@pytest.mark.parametrize("seed", range(4))
def test_spread_keeps_the_share_and_is_the_identity_on_the_same_layers(seed):
    g = torch.Generator().manual_seed(seed)
    bits = [4 if x else 2 for x in (torch.rand(30, generator=g) < 0.5).tolist()]
    assert spread(bits, 30) == tuple(bits)
    for n in (12, 36, 64):
        out = spread(bits, n)
        assert sum(b == 4 for b in out) == round(bits.count(4) * n / 30) and set(out) <= {2, 4}


def test_spread_places_4_bit_layers_at_the_recipes_depths():
    bits = [4] * 5 + [2] * 25  # the first sixth of the layers
    assert spread(bits, 36) == (4,) * 6 + (2,) * 30
    assert spread([2] * 30, 36) == (2,) * 36


@pytest.mark.parametrize("fraction, n", [(0.25, 36), (0.5, 7), (0.9, 36), (1.0, 5)])
def test_even_spacing(fraction, n):
    out = even(fraction, n)
    fours = [i for i, b in enumerate(out) if b == 4]
    assert len(fours) == round(fraction * n)
    gaps = [b - a for a, b in zip(fours, fours[1:])]
    assert not gaps or max(gaps) - min(gaps) <= 1


def test_recipe_file_brings_its_windows(tmp_path):
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"recipe": {"sink": 0, "recent": 128, "layer_key_bits": [4, 2, 2] * 10}}))
    kv = allocation_config(str(f), 36, 8)
    assert (kv.sink, kv.recent, kv.method) == (0, 128, "oscar") and kv.layer_key_bits.count(4) == 12
    assert kv.page_size == KVConfig.page_size
    g = tmp_path / "p16.json"
    g.write_text(json.dumps({"sink": 0, "recent": 16, "page_size": 16, "layer_key_heads": [[0], [], [1, 2]] * 10}))
    kv = allocation_config(str(g), 36, 8)  # the page size the recipe's windows were sized for
    assert (kv.sink, kv.recent, kv.page_size) == (0, 16, 16) and sum(map(len, kv.layer_key_heads)) > 0
    with pytest.raises(ValueError, match="neither a fraction"):
        DecodeBench(layer_key_bits=("1.5",))
    labels = [label for label, _ in decode.kv_configs(DecodeBench(methods=("bf16",), layer_key_bits=(str(f), "0.5")), 36, 8)]
    assert labels == ["bf16", "oscar-k4x12+win", "oscar-k4x18+win"]


def test_recipe_file_brings_its_value_bits(tmp_path):
    """A recipe with 4-bit values in some layers (lab/scripts/twobit_recipe_8192_k4_v7.json) keeps their share too."""
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"sink": 64, "recent": 64, "layer_key_bits": [4] * 30,
                             "layer_value_bits": [4 if i in (1, 2, 7, 14, 18, 20, 23) else 2 for i in range(30)]}))
    kv = allocation_config(str(f), 36, 8)
    assert kv.layer_key_bits == (4,) * 36 and kv.layer_value_bits.count(4) == 8 and len(kv.layer_value_bits) == 36
    assert allocation_config(str(f), 30, 8).layer_value_bits[18] == 4


def _running(engine, prompt: int):
    engine.add_request("r", torch.randint(0, 128, (prompt,)).tolist(),
                       SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
    while not (engine.scheduler.running and engine.scheduler.running[0].output_ids):
        engine.step()
    return engine.scheduler.running


def test_allocation_engine_pools_bits_and_bytes():
    """The allocation's engine keeps each layer at its bits (per-layer pools), its bits per element are the codec's
    (INT2 and K4V2 mixed by the share of 4-bit layers), and a step reads d/4 more bytes per history token, KV
    head and 4-bit layer than INT2's."""
    model = PagedLM.random(CONFIG)
    kv = allocation_config("0.5", L, 2)
    assert kv.layer_key_bits == (2, 4, 2, 4, 2, 4)
    engines = {name: e2e.build_engine(model, cfg, kv_bytes=1 << 22, max_num_seqs=1, chunk=64)
               for name, cfg in (("alloc", kv), ("int2", KVConfig("oscar")))}
    geo = engines["alloc"].runner.pools.geo
    assert [geo.bits_of(i) for i in range(L)] == [(b, 2) for b in kv.layer_key_bits]
    art = e2e.random_artifact(CONFIG)
    uniform = {b: build_codec(KVConfig("oscar", key_bits=b), L, 2, 32, art).bpe(700) for b in (2, 4)}
    assert engines["alloc"].codec.bpe(700) == pytest.approx((uniform[2] + uniform[4]) / 2)
    assert engines["alloc"].codec.bpe(700) == build_codec(kv, L, 2, 32, art).bpe(700)
    read = {name: e2e.kv_read_bytes(engine, _running(engine, 700)) for name, engine in engines.items()}
    hist = engines["alloc"].manager.tier_tokens(engines["alloc"].scheduler.running[0])[1]
    assert hist > 0 and read["alloc"] - read["int2"] == hist * 3 * 2 * 32 // 4


def test_a_per_head_recipe_carries_its_head_shares(tmp_path):
    """A per-head recipe of the default model (3 KV heads) at a shape of 8: each layer the share of the source layer
    at its depth, its first heads; the bench engine serves it as two head ranges per split layer."""
    src = [[], [0], [0, 2], [0, 1, 2]] * 3  # 12 source layers: 0, 1, 2, 3 of 3 heads
    f = tmp_path / "heads.json"
    f.write_text(json.dumps({"recipe": {"sink": 64, "recent": 64, "layer_key_heads": src}}))
    kv = allocation_config(str(f), 24, 8)
    assert [len(h) for h in kv.layer_key_heads] == [0, 0, 3, 3, 5, 5, 8, 8] * 3 and kv.layer_key_heads[2] == (0, 1, 2)
    small = allocation_config(str(f), L, 2)
    engine = e2e.build_engine(PagedLM.random(CONFIG), small, kv_bytes=1 << 22, max_num_seqs=1, chunk=64)
    split = [len(engine.runner.pools.parts(i)) for i in range(L)]
    assert split == [1 if len(h) in (0, 2) else 2 for h in small.layer_key_heads]


def test_prefill_bench_times_allocations_too(tmp_path):
    """``oscarkv bench prefill --layer-key-bits``: the same rows as decode's (methods, then each allocation)."""
    from oscarkv.bench.configs import PrefillBench
    from oscarkv.bench.layer_bits import kv_rows
    from oscarkv.cli.main import build_parser

    f = tmp_path / "heads.json"
    f.write_text(json.dumps({"sink": 64, "recent": 64, "layer_key_heads": [[0]] * 30}))
    args = build_parser().parse_args(["bench", "prefill", "--layer-key-bits", str(f), "--methods", "bf16"])
    assert args.layer_key_bits == (str(f),) or args.layer_key_bits == [str(f)]
    cfg = PrefillBench(methods=("bf16",), layer_key_bits=(str(f),))
    assert [label for label, _ in kv_rows(cfg.methods, cfg.layer_key_bits, 36, 8)] == ["bf16", "oscar-kh4x108+win"]
    with pytest.raises(ValueError, match="PrefillBench.layer_key_bits"):
        PrefillBench(layer_key_bits=("2",))
