"""A tiny random Llama over the default model's tokenizer: real task prompts, fast forwards."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.engine.conftest import tiny_config


@pytest.fixture(scope="session")
def loaded(default_tokenizer):
    tok = default_tokenizer
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(vocab_size=len(tok))).eval()
    return SimpleNamespace(model=model, tokenizer=tok, source="tiny", config=model.config)
