"""``eval --backend engine`` scores like the HF path: same protocol, same spans matched."""

import pytest
import torch

from oscarkv.config import EvalConfig, KVConfig
from oscarkv.eval.engine_backend import build_engines, score_engine
from oscarkv.eval.runner import prefill, score_sample
from oscarkv.quant.codec import build_codec
from tests.engine.conftest import D, HKV, L, VOCAB, WINDOWS


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_engine_backend_matches_hf_path(llama, artifact, method):
    kv = KVConfig(method, group_size=D if method != "bf16" else None, **WINDOWS)
    codec = build_codec(kv, L, HKV, D, artifact if method == "oscar" else None)
    loaded = type("Loaded", (), {"model": llama, "tokenizer": None})()
    engine = build_engines(loaded, {method: codec}, EvalConfig(contexts=(256,)), {"": artifact})[method]
    g = torch.Generator().manual_seed(12)
    doc, q = torch.randint(0, VOCAB, (1, 45), generator=g), torch.randint(0, VOCAB, (1, 5), generator=g)
    with torch.no_grad():  # a target the model half predicts: its own greedy tokens, every other one replaced
        ids = doc
        for _ in range(8):
            ids = torch.cat([ids if ids.shape[1] > 45 else torch.cat([doc, q], 1),
                             llama(ids if ids.shape[1] > 45 else torch.cat([doc, q], 1)).logits[:, -1:].argmax(-1)], 1)
    target = ids[:, 50:].clone()
    target[0, ::3] = (target[0, ::3] + 1) % VOCAB
    spans = [(j, j + 1) for j in range(target.shape[1])]
    hf_acc, _, _ = score_sample(llama, prefill(llama, doc), codec, q, target, spans)
    eng_acc, _ = score_engine(engine, doc[0].tolist(), q[0].tolist(), target[0].tolist(), spans)
    assert 0 < hf_acc < 1 and eng_acc == hf_acc
