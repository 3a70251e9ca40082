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
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, vocab_size=50, architectures=["LlamaForCausalLM"])
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    _word_tokenizer().save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), torch.bfloat16)
    assert loaded.config.architectures == ["LlamaForCausalLM"]
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert loaded.tokenizer("w1 w2").input_ids[-2:] == [1, 2]


def test_weights_are_read_in_the_asked_dtype(tmp_path, monkeypatch):
    """No float32 copy on the way to bf16 (an 8B model's host peak was 3× its size): the weights are read in the
    dtype asked for, and equal a float32 read cast to it (the rotary tables too, which the cast sets)."""
    import transformers

    seen = []
    real = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: seen.append(k["dtype"]) or real(*a, **k))
    path = _tiny_dir(tmp_path)
    direct, via32 = load_model(path, torch.bfloat16).model, load_model(path).model.to(torch.bfloat16)
    assert seen == [torch.bfloat16, torch.float32]
    for (name, a), b in zip(direct.state_dict().items(), via32.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    rotary = [(n, b) for n, b in direct.named_buffers() if "inv_freq" in n]
    assert rotary and all(b.dtype == torch.bfloat16 for _, b in rotary)


def _tiny_dir(path):
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, vocab_size=50, architectures=["LlamaForCausalLM"])
    LlamaForCausalLM(cfg).save_pretrained(path)
    _word_tokenizer().save_pretrained(path)
    return str(path)


def test_device_names():
    """``auto`` is the CPU here, the CPU's ``auto`` dtype is float32, and a device that is not there
    is a clear error (the serving commands' ``--device``)."""
    from oscarkv.models.loader import resolve_device, resolve_dtype

    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    with pytest.raises(ModelLoadError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(ModelLoadError, match="no CUDA device is visible"):
            resolve_device("cuda")


def test_cli_device_without_gpu_is_a_user_error(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    from oscarkv.cli.main import main

    assert main(["generate", "--model", _tiny_dir(tmp_path), "--kv", "bf16", "--device", "cuda", "--prompt", "hi"]) == 2
    assert "no CUDA device is visible" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_serving_entry_points_run_on_the_gpu(tmp_path):
    """``LLM`` (and so ``serve``, ``generate``, ``eval``) puts a loaded model on the GPU by default, in
    bf16, and the engine, its pools and its kernels follow the weights."""
    from oscarkv.engine.request import SamplingParams
    from oscarkv.llm import LLM

    llm = LLM(_tiny_dir(tmp_path), kv="bf16")
    p = next(llm.loaded.model.parameters())
    assert p.device.type == "cuda" and p.dtype == torch.bfloat16
    assert llm.engine.runner.device.type == "cuda"
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(out[0].token_ids) == 4


def test_gguf_conversion_is_cached_by_content(tmp_path, monkeypatch):
    """A GGUF file is converted once; the same bytes load from the cache, changed bytes convert anew."""
    from oscarkv.models import loader

    src = tmp_path / "tiny" / "model.gguf"
    src.parent.mkdir()
    src.write_bytes(b"GGUF-one")
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, vocab_size=50, architectures=["LlamaForCausalLM"])
    model = LlamaForCausalLM(cfg)
    conversions = []

    def fake_convert(path):
        conversions.append(path.read_bytes())
        return model, _word_tokenizer()

    monkeypatch.setattr(loader, "_load_gguf", fake_convert)
    cache = tmp_path / "cache"
    first = loader.load_model(str(src), cache_dir=cache)
    second = loader.load_model(str(src), cache_dir=cache)
    assert conversions == [b"GGUF-one"] and second.source == str(src)
    for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values()):
        assert torch.equal(a, b)
    src.write_bytes(b"GGUF-two")
    loader.load_model(str(src), cache_dir=cache)
    assert conversions == [b"GGUF-one", b"GGUF-two"]
    assert len([p for p in (cache / "models").iterdir() if not p.name.startswith(".")]) == 2


def _word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({f"w{i}": i for i in range(50)}, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk)
