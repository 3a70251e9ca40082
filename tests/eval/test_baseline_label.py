"""The unquantized baseline is labelled with the dtype its cache stores, and carries that dtype's BPE."""

import torch

from oscarkv.config import EvalConfig
from oscarkv.eval.runner import build_codecs, prefill, score_sample
from tests.engine.conftest import VOCAB, tiny_model


def test_baseline_label_and_bpe_follow_the_stored_dtype():
    g = torch.Generator().manual_seed(0)
    doc, q = torch.randint(0, VOCAB, (1, 40), generator=g), torch.randint(0, VOCAB, (1, 4), generator=g)
    target = torch.randint(0, VOCAB, (1, 3), generator=g)
    for dtype, label, bits in ((torch.float32, "fp32", 32.0), (torch.bfloat16, "bf16", 16.0)):
        model = tiny_model().to(dtype)
        codecs = build_codecs(model, EvalConfig(methods=("bf16", "naive"), windows=(True,)))
        assert set(codecs) == {label, "naive+win"}
        _, _, cache = score_sample(model, prefill(model, doc), codecs[label], q, target, [(0, 3)])
        assert cache.bpe() == bits  # measured from the bytes the cache holds
