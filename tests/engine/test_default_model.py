"""The real default model (SmolLM2-135M, fp32 on the CPU): kv=bf16 greedy ≡ transformers over 64 tokens."""

import pytest
import torch
from transformers import DynamicCache

from oscarkv.config import EngineConfig, KVConfig
from oscarkv.engine.engine import LLMEngine
from tests.engine.conftest import hf_greedy, run

PROMPTS = ["The capital of France is"]  # one prompt: CI time (the engine attention is the slow oracle)


@pytest.mark.slow
def test_default_model_bf16_matches_transformers():
    from oscarkv.engine.request import SamplingParams
    from oscarkv.models.loader import load_model

    loaded = load_model("default", torch.float32)
    cfg = EngineConfig(KVConfig("bf16"), kv_memory_bytes=1 << 26, max_num_seqs=4)
    engine = LLMEngine.from_hf(loaded.model, cfg, None, loaded.tokenizer)
    ids = [loaded.tokenizer(p).input_ids for p in PROMPTS]
    outs = run(engine, ids, SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
    for p, out in zip(ids, outs):
        toks, _ = hf_greedy(loaded.model, p, 64, DynamicCache(config=loaded.config))
        assert out.token_ids == toks
