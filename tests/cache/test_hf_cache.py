"""OscarCache on a tiny random Llama: DynamicCache parity, a fake-quant reference, tiers, bytes.

The reference is written here from the codec's primitives, independently of the cache's
bookkeeping: sink and recent are the BF16-rounded rotated K/V mapped back, a history page is
the codec round trip of those BF16 values (the documented demotion source), and the current
chunk is exact.
"""

import copy

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from oscarkv.cache.hf_cache import OscarCache, OscarLayer, cache_kwargs
from oscarkv.config import KVConfig
from oscarkv.quant.artifact import ArtifactError
from oscarkv.quant.bpe import Tiers, history_end, tiers
from oscarkv.quant.codec import TensorCodec, build_codec
from tests.engine.conftest import make_artifact

L, HKV, D, VOCAB = 2, 2, 32, 100
WINDOWS = dict(sink=8, recent=16, page_size=8)
QUANTIZED = ("naive", "quarot", "kivi", "oscar", "int4")


def tiny_config(**kw) -> LlamaConfig:
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=L, num_attention_heads=4,
                num_key_value_heads=HKV, head_dim=D, vocab_size=VOCAB, architectures=["LlamaForCausalLM"])
    config = LlamaConfig(**{**base, **kw})
    config._attn_implementation = "sdpa"
    return config


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_config()).eval()


@pytest.fixture(scope="module")
def artifact_dir(tmp_path_factory):
    """Random orthogonal rotations and means, filled in like ``oscarkv calibrate`` writes them."""
    return make_artifact(tiny_config()).save(tmp_path_factory.mktemp("artifact"))


def make_cache(method: str, artifact_dir, dequant_cache: bool = False, **windows) -> OscarCache:
    kv = KVConfig(method, **(windows or WINDOWS))
    if method == "oscar":
        return OscarCache.from_artifact(tiny_config(), artifact_dir, kv, dequant_cache=dequant_cache)
    return OscarCache(tiny_config(), kv, dequant_cache=dequant_cache)


def record(cache) -> list[list[tuple[torch.Tensor, ...]]]:
    """Wrap each layer's ``update`` (this cache instance only) to log (k_in, v_in, k_out, v_out)."""
    logs: list[list] = [[] for _ in cache.layers]
    for layer, log in zip(cache.layers, logs):
        def update(k, v, *args, _inner=layer.update, _log=log, **kwargs):
            ko, vo = _inner(k, v, *args, **kwargs)
            _log.append((k.clone(), v.clone(), ko.clone(), vo.clone()))
            return ko, vo
        layer.update = update
    return logs


def run_chunks(model, cache, ids: torch.Tensor, chunks: list[int]) -> None:
    """Feed ``ids [B, T]`` through the model in chunks of the given sizes."""
    start = 0
    with torch.no_grad():
        for n in chunks:
            model(input_ids=ids[:, start:start + n], cache=cache, use_cache=True)
            start += n


def expected(codec: TensorCodec, kv: KVConfig, chunks: list[torch.Tensor]) -> torch.Tensor:
    """Reference K or V ``[H, t, d]`` returned for a row whose inputs so far are ``chunks``
    (``[H, T_i, d]`` each, the last one current). Each chunk is rotated as it arrived."""
    x = torch.cat(chunks, dim=1).transpose(0, 1).float()  # [t, H, d]
    t, t0, P = x.shape[0], x.shape[0] - chunks[-1].shape[1], kv.page_size
    bf = torch.cat([codec.to_rotated(c.transpose(0, 1)).bfloat16() for c in chunks]).float()
    out = codec.from_rotated(bf)  # sink and recent
    for a in range(min(t, kv.sink), history_end(t, kv.sink, kv.recent, P), P):
        out[a:a + P] = codec.from_rotated(codec.decode(codec.encode(bf[a:a + P])))
    out[t0:] = x[t0:]  # the current chunk, exactly as given
    return out.transpose(0, 1)


def test_bf16_is_dynamic_cache(model):
    ids = torch.randint(0, VOCAB, (1, 150), generator=torch.Generator().manual_seed(2))
    kw = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False)
    dyn = DynamicCache(config=model.config)
    oscar = OscarCache(model.config, KVConfig("bf16", **WINDOWS))
    dyn_log, oscar_log = record(dyn), record(oscar)
    assert torch.equal(model.generate(ids, **cache_kwargs(oscar), **kw), model.generate(ids, **cache_kwargs(dyn), **kw))
    for a, b in zip(dyn_log, oscar_log):
        assert len(a) == len(b) == 20
        for ta, tb in zip(a, b):
            assert all(torch.equal(u, v) for u, v in zip(ta, tb))


@pytest.mark.parametrize("method", QUANTIZED)
@pytest.mark.parametrize("chunks", [[45] + [1] * 12, [13, 20, 12] + [1] * 12], ids=["prefill", "chunked"])
def test_matches_fake_quant_reference(model, artifact_dir, method, chunks):
    ids = torch.randint(0, VOCAB, (2, sum(chunks)), generator=torch.Generator().manual_seed(3))
    cache = make_cache(method, artifact_dir)
    logs = record(cache)
    run_chunks(model, cache, ids, chunks)
    for codec, log in zip(cache.codec.layers, logs):
        for kind, tc in ((0, codec.key), (1, codec.value)):
            for step, entry in enumerate(log):
                for b in range(2):
                    ref = expected(tc, cache.codec.config, [e[kind][b] for e in log[:step + 1]])
                    torch.testing.assert_close(entry[2 + kind][b], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["naive", "kivi", "int4"])
def test_chunking_does_not_change_what_is_stored(method):
    """Metamorphic: chunked ≡ unchunked prefill ≡ token by token, bit for bit (methods without a
    rotation, so the check does not depend on the matmul kernel's batch invariance)."""
    kv = KVConfig(method, **WINDOWS)
    codec = build_codec(kv, 1, HKV, D).layers[0]
    k, v = torch.randn(2, 2, HKV, 61, D, generator=torch.Generator().manual_seed(9))

    def stores(chunks: list[int]):
        layer, start = OscarLayer(codec, kv), 0
        for n in chunks:
            layer.update(k[..., start:start + n, :], v[..., start:start + n, :])
            start += n
        return [s for row in layer.rows for s in row]

    for other in ([13, 20, 12, 16], [1] * 61):
        for a, b in zip(stores([61]), stores(other)):
            assert torch.equal(a.sink, b.sink) and torch.equal(a.recent, b.recent)
            assert a.history == b.history == 32
            if a.codec.per_channel:  # KIVI keys: one block per page, whatever the chunking
                assert len(a.blocks) == len(b.blocks) == 4
                assert all(torch.equal(u, w) for pa, pb in zip(a.blocks, b.blocks) for u, w in zip(pa, pb))
            else:  # per-token codes: the same tokens' codes, however they were split into blocks
                for fa, fb in zip(zip(*a.blocks), zip(*b.blocks)):  # codes, scale, zero
                    assert torch.equal(torch.cat(fa), torch.cat(fb))


@pytest.mark.parametrize("method,dtype", [("kivi", torch.float32), ("oscar", torch.float32),
                                          ("naive", torch.bfloat16), ("oscar", torch.bfloat16)])
def test_dequant_cache_is_bit_identical(model, artifact_dir, method, dtype):
    net = copy.deepcopy(model).to(dtype)
    ids = torch.randint(0, VOCAB, (1, 60), generator=torch.Generator().manual_seed(4))
    chunks = [37, 10] + [1] * 13
    caches = [make_cache(method, artifact_dir, dequant_cache=flag) for flag in (False, True)]
    logs = [record(c) for c in caches]
    for c in caches:
        run_chunks(net, c, ids, chunks)
    for la, lb in zip(*logs):
        assert all(torch.equal(u, v) for ta, tb in zip(la, lb) for u, v in zip(ta, tb))
        for k_in, _, k_out, _ in la:  # the current chunk comes back exactly, in the model dtype
            assert k_out.dtype == dtype and torch.equal(k_out[:, :, -k_in.shape[2]:], k_in)
    plain, cached = (c.memory_bytes() for c in caches)
    n_hist = caches[0].tiers().history
    assert plain["dequant_cache"] == 0
    assert cached["dequant_cache"] == L * 2 * n_hist * HKV * D * dtype.itemsize
    assert {k: v for k, v in plain.items() if k != "dequant_cache"} == \
           {k: v for k, v in cached.items() if k != "dequant_cache"}


@pytest.mark.parametrize("prompt,hand", [
    (5, {5: (5, 0, 0), 8: (8, 0, 0), 9: (8, 0, 1), 24: (8, 0, 16)}),  # inside the sink
    (20, {20: (8, 0, 12), 31: (8, 0, 23), 32: (8, 8, 16), 39: (8, 8, 23)}),  # inside the recent window
    (70, {70: (8, 40, 22), 71: (8, 40, 23), 72: (8, 48, 16), 89: (8, 64, 17)}),  # long
])
def test_tier_counts_every_step(model, prompt, hand):
    ids = torch.randint(0, VOCAB, (2, prompt + 20), generator=torch.Generator().manual_seed(5))
    cache = make_cache("naive", None)
    for t, n in zip(range(prompt, prompt + 21), [prompt] + [1] * 20):
        run_chunks(model, cache, ids[:, t - n:], [n])
        assert cache.get_seq_length() == t
        for layer in cache.layers:
            for store in (s for row in layer.rows for s in row):
                assert store.tiers() == tiers(t, 8, 16, 8)
        if t in hand:
            assert cache.tiers() == Tiers(*hand[t])


@pytest.mark.parametrize("method", ["kivi", "naive"])
def test_pages_are_encoded_once(model, monkeypatch, method):
    """Each token is encoded once: KIVI one page per call, per-token codecs one call per demotion."""
    calls = []
    encode = TensorCodec.encode
    monkeypatch.setattr(TensorCodec, "encode", lambda self, x: calls.append(x.shape[0]) or encode(self, x))
    ids = torch.randint(0, VOCAB, (2, 100), generator=torch.Generator().manual_seed(6))
    cache = make_cache(method, None)
    run_chunks(model, cache, ids, [70])
    stores = [s for layer in cache.layers for row in layer.rows for s in row]
    assert len(calls) == sum(5 if s.codec.per_channel else 1 for s in stores)  # 40 history tokens, 5 pages
    assert sum(calls) == len(stores) * 40
    first = [(list(s.blocks), [p.codes.clone() for p in s.blocks]) for s in stores]
    run_chunks(model, cache, ids[:, 70:], [1] * 30)
    n_prompt = sum(5 if s.codec.per_channel else 1 for s in stores)
    assert set(calls[n_prompt:]) == {8}  # decoding demotes one page at a time
    assert sum(calls) == sum(s.history for s in stores) == L * 2 * 2 * cache.tiers().history
    for s, (blocks, codes) in zip(stores, first):
        assert all(a is b for a, b in zip(s.blocks, blocks))  # the same stored objects, untouched
        assert all(torch.equal(p.codes, c) for p, c in zip(s.blocks, codes))


@pytest.mark.parametrize("method", ["naive", "kivi", "int4", "oscar"])
def test_memory_bytes_arithmetic(model, artifact_dir, method):
    B, t = 2, 91
    ids = torch.randint(0, VOCAB, (B, t), generator=torch.Generator().manual_seed(7))
    cache = make_cache(method, artifact_dir)
    run_chunks(model, cache, ids, [80] + [1] * 11)
    sink, hist, recent = cache.tiers()
    assert (sink, hist, recent) == (8, 64, 19)
    per = L * B * HKV * D  # elements per token of one kind (K or V), all layers and rows
    bits = 4 if method == "int4" else 2
    value_hist = per * hist * bits // 8 + per * hist // D * 4  # codes + fp16 scale and zero per group of D
    key_hist = value_hist if method != "kivi" else per * hist * 2 // 8 + per * (hist // 8) * 4  # per channel, per page
    got = cache.memory_bytes()
    assert got == {"sink": 2 * per * sink * 2, "history": key_hist + value_hist, "recent": 2 * per * recent * 2,
                   "dequant_cache": 0}
    assert cache.bf16_equivalent_bytes() == 2 * per * t * 2
    stored = got["sink"] + got["history"] + got["recent"]
    assert cache.bpe() == pytest.approx(8 * stored / (2 * per * t))
    assert cache.bpe() == pytest.approx(cache.codec.bpe(t))


@pytest.mark.parametrize("method", ("bf16",) + QUANTIZED)
def test_generate_batch_rows_are_independent(model, artifact_dir, method):
    ids = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(8))
    kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(ids))
    cache = make_cache(method, artifact_dir)
    both = model.generate(ids, **cache_kwargs(cache), **kw)
    assert both.shape == (2, 52) and cache.get_seq_length() == 51
    for b in range(2):
        row_kw = kw | dict(attention_mask=kw["attention_mask"][b:b + 1])
        one = model.generate(ids[b:b + 1], **cache_kwargs(make_cache(method, artifact_dir)), **row_kw)
        assert torch.equal(one[0], both[b])


def test_from_artifact_checks_the_model(artifact_dir):
    with pytest.raises(ArtifactError, match=r"model\.num_kv_heads"):
        OscarCache.from_artifact(tiny_config(num_key_value_heads=1), artifact_dir)
    with pytest.raises(ValueError, match="method 'oscar'"):
        OscarCache.from_artifact(tiny_config(), artifact_dir, KVConfig("naive"))
    assert OscarCache.from_artifact(tiny_config(), artifact_dir).codec.config.method == "oscar"


def test_unsupported_operations_raise(model):
    cache = make_cache("naive", None)
    run_chunks(model, cache, torch.zeros(1, 4, dtype=torch.long), [4])
    with pytest.raises(NotImplementedError, match="beam"):
        cache.reorder_cache(torch.tensor([0]))
    with pytest.raises(NotImplementedError, match="crop"):
        cache.crop(-1)
    assert not cache.is_compileable
