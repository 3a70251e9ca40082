"""Model loading: clear errors for missing files and unsupported architectures; a tiny HF dir loads."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from oscarkv.models.loader import ModelLoadError, default_model_path, load_model


def test_missing_path():
    with pytest.raises(ModelLoadError, match="model not found: /nonexistent"):
        load_model("/nonexistent")


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'GPT2LMHeadModel'"):
        load_model(str(tmp_path))


def test_missing_config(tmp_path):
    with pytest.raises(ModelLoadError, match="missing config.json"):
        load_model(str(tmp_path))


def test_missing_weights(tmp_path):
    LlamaConfig(architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        load_model(str(tmp_path))


def test_default_model_is_embedded():
    path = default_model_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_tiny_hf_dir_loads(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, vocab_size=50, architectures=["LlamaForCausalLM"])
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    vocab = {f"w{i}": i for i in range(50)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk).save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), torch.bfloat16)
    assert loaded.config.architectures == ["LlamaForCausalLM"]
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert loaded.tokenizer("w1 w2").input_ids[-2:] == [1, 2]
