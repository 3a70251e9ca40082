"""A ``Gemma3ForConditionalGeneration`` directory served text only, on a tiny random ``Gemma3Config`` (no download).

The checkpoint is written by transformers' ``save_pretrained`` (``language_model.model.*``) and, rewritten, in the
``model.language_model.*`` layout of transformers 4.52-4.57, and in shards; its text model has the tiny Gemma 3 geometry of
tests/engine (layer 0 slides over 12 tokens, layer 1 is global; tied embeddings, as the published checkpoints).
Loading reads the language model's tensors only and gives transformers' weights; the engine's ``kv=bf16`` greedy
tokens equal transformers' ``Gemma3ForConditionalGeneration`` text generation past the window; ``oscarkv
calibrate`` on the directory makes an artifact with which the engine's ``kv=oscar`` tokens equal that model's with
``OscarCache``.
"""

import logging
import re

import pytest
import safetensors
import torch
from safetensors.torch import load_file, save_file
from transformers import DynamicCache, Gemma3Config, Gemma3ForConditionalGeneration

from oscarkv.cache.hf_cache import OscarCache
from oscarkv.engine.engine import LLMEngine
from oscarkv.models.loader import ModelLoadError, bf16_layers, load_config, load_model
from oscarkv.quant.artifact import Artifact, ModelFingerprint
from tests.engine.conftest import EXTRA, engine_config, hf_greedy, prompts, run, tiny_config
from tests.server.conftest import SPECIAL, byte_tokenizer

N, VOCAB = 16, len(SPECIAL) + 256
TEXT_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "head_dim", *EXTRA["Gemma3ForCausalLM"])


def tiny_multimodal() -> Gemma3ForConditionalGeneration:
    text = tiny_config("Gemma3ForCausalLM").to_dict()
    text = {k: text[k] for k in TEXT_FIELDS} | dict(vocab_size=VOCAB + 3, tie_word_embeddings=True)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, boi_token_index=VOCAB,
                          eoi_token_index=VOCAB + 1, image_token_index=VOCAB + 2, eos_token_id=[256, 257],
                          architectures=["Gemma3ForConditionalGeneration"])
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # peaky logits, as tests/engine does: fewer near-ties between tokens
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.15)
    return model


def _older_layout(name: str) -> str:
    """transformers 4.52-4.57's name of a tensor transformers 5 saves as ``name``."""
    name = re.sub(r"^language_model\.model\.", "model.language_model.", name)
    return re.sub(r"^language_model\.lm_head\.", "lm_head.", re.sub(r"^(vision_tower|multi_modal_projector)", r"model.\1", name))


def write_checkpoint(path, layout: str = "saved"):
    """The tiny model's directory (byte tokenizer) as ``save_pretrained`` writes it (in one file or ``sharded``),
    or in the ``older`` layout."""
    tiny_multimodal().save_pretrained(path, max_shard_size="40KB" if layout == "sharded" else "1GB")
    assert (layout == "sharded") == (len(list(path.glob("*.safetensors"))) > 1)
    byte_tokenizer().save_pretrained(path)
    if layout == "older":
        state = {_older_layout(k): v for k, v in load_file(path / "model.safetensors").items()}
        assert "model.language_model.layers.0.self_attn.k_proj.weight" in state
        save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module", params=["saved", "older", "sharded"])
def mm_dir(request, tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp(f"gemma-mm-{request.param}"), request.param)


@pytest.fixture(scope="module")
def reference(mm_dir):
    model = Gemma3ForConditionalGeneration.from_pretrained(mm_dir, dtype=torch.float32).eval()
    model.config._attn_implementation = "sdpa"
    return model


def test_the_language_model_is_loaded_and_nothing_else(mm_dir, reference, monkeypatch, caplog):
    read, safe_open = [], safetensors.safe_open

    class Spy:  # records the tensors whose data is read
        def __init__(self, *a, **kw):
            self.h = safe_open(*a, **kw)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.h.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(self.h, name)

        def get_tensor(self, name):
            read.append(name)
            return self.h.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    with caplog.at_level(logging.INFO, logger="oscarkv.models.multimodal"):
        loaded = load_model(str(mm_dir))
    assert [r.getMessage().endswith("text only: the vision tower is not loaded") for r in caplog.records] == [True]
    assert read and not [n for n in read if "vision" in n or "projector" in n]
    assert type(loaded.model).__name__ == "Gemma3ForCausalLM" and loaded.config.architectures == ["Gemma3ForCausalLM"]
    assert loaded.config.eos_token_id == [256, 257] and bf16_layers(loaded.config) == {0}
    assert ModelFingerprint.from_config(load_config(str(mm_dir))) == ModelFingerprint.from_config(loaded.config)
    want = reference.model.language_model.state_dict()
    got = {k.removeprefix("model."): v for k, v in loaded.model.state_dict().items() if k != "lm_head.weight"}
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_engine_bf16_matches_transformers_text_generation(mm_dir, reference):
    loaded = load_model(str(mm_dir))
    ps = prompts(2, 40)  # past the 12-token window
    outs = run(LLMEngine.from_hf(loaded.model, engine_config("bf16", prefill_chunk=16, max_num_batched_tokens=32)), ps)
    for p, out in zip(ps, outs):
        toks, lps = hf_greedy(reference, p, N, DynamicCache(config=reference.config.text_config), chunk=16)
        assert out.token_ids[:N] == toks
        assert max(abs(a - b) for a, b in zip(out.logprobs, lps)) < 1e-4


def test_calibrate_then_serve_kv_oscar(tmp_path):
    """``oscarkv calibrate`` on the directory (the text model's layers; the sliding one left BF16), then the
    engine with ``kv=oscar`` and that artifact gives transformers' multimodal model's tokens with ``OscarCache``."""
    from oscarkv.cli.main import main

    path = write_checkpoint(tmp_path / "gemma-mm")
    assert main(["calibrate", "--model", str(path), "--out", str(tmp_path / "art"), "--tokens", "256",
                 "--heldout-tokens", "64", "--chunk", "64", "--dtype", "float32"]) == 0
    loaded = load_model(str(path))
    art = Artifact.load(tmp_path / "art", ModelFingerprint.from_config(loaded.config))
    assert art.manifest["bf16_layers"] == [0] and art.manifest["clip"]["key"][0] == 1.0
    reference = Gemma3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    ps, cfg = prompts(2, 41), engine_config("oscar", prefill_chunk=16, max_num_batched_tokens=32)
    for p, out in zip(ps, run(LLMEngine.from_hf(loaded.model, cfg, art), ps)):
        cache = OscarCache(loaded.config, cfg.kv, art)
        toks, _ = hf_greedy(reference, p, N, cache, chunk=16)
        assert out.token_ids[:N] == toks
        assert cache.layers[0].keys.dtype == torch.bfloat16 and cache.layers[0].keys.shape[2] == 11  # the window


PUBLISHED = {  # gemma-3-4b-it's config.json (transformers 4.50) at tiny sizes: no layer_types, linear RoPE scaling
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": VOCAB, "eoi_token_index": VOCAB + 1,
    "eos_token_id": [256, 257], "image_token_index": VOCAB + 2, "mm_tokens_per_image": 4, "model_type": "gemma3",
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "text_config": {"hidden_size": 64, "intermediate_size": 128, "model_type": "gemma3_text", "num_hidden_layers": 6,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "query_pre_attn_scalar": 32,
                    "vocab_size": VOCAB + 3, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 12},
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "model_type": "siglip_vision_model",
                      "num_attention_heads": 2, "num_hidden_layers": 1, "image_size": 28, "patch_size": 14}}


def test_a_published_config_with_bf16_weights(tmp_path):
    """The published config's shape (layer types from the default pattern: 5 sliding, 1 global; the global layers'
    RoPE scaled linearly) and bf16 weights: loaded in fp32 as transformers loads them; kv=bf16 tokens equal its."""
    import json

    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED))
    torch.manual_seed(1)
    model = Gemma3ForConditionalGeneration(AutoConfig.from_pretrained(tmp_path))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.02 if "norm" in name else 0.15)
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED))  # as published, not as transformers 5 rewrites it
    byte_tokenizer().save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    assert bf16_layers(loaded.config) == {0, 1, 2, 3, 4} and loaded.config.eos_token_id == [256, 257]
    assert loaded.config.rope_parameters["full_attention"]["rope_type"] == "linear"
    reference = Gemma3ForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert torch.equal(loaded.model.model.layers[5].mlp.up_proj.weight, reference.model.language_model.layers[5].mlp.up_proj.weight)
    ps = prompts(2, 40)
    for p, out in zip(ps, run(LLMEngine.from_hf(loaded.model, engine_config("bf16")), ps)):
        toks, lps = hf_greedy(reference, p, N, DynamicCache(config=reference.config.text_config))
        assert out.token_ids[:N] == toks and max(abs(a - b) for a, b in zip(out.logprobs, lps)) < 1e-4


def test_a_missing_language_tensor_is_refused_and_the_vision_tower_is_not_needed(tmp_path):
    path = write_checkpoint(tmp_path / "gemma-mm")
    state = load_file(path / "model.safetensors")
    text_only = {k: v for k, v in state.items() if k.startswith("language_model.")}
    save_file(text_only, path / "model.safetensors", metadata={"format": "pt"})
    assert load_model(str(path)).config.architectures == ["Gemma3ForCausalLM"]
    del text_only["language_model.model.layers.1.mlp.up_proj.weight"]
    save_file(text_only, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"tensor model\.layers\.1\.mlp\.up_proj\.weight: missing from model\.safetensors"):
        load_model(str(path))


def test_the_chat_template_of_the_processor_is_the_tokenizers(tmp_path):
    """A checkpoint whose chat template is the processor's ``chat_template.json`` alone chats with it."""
    import json

    path = write_checkpoint(tmp_path / "gemma-mm")
    template = (path / "chat_template.jinja").read_text()
    (path / "chat_template.jinja").unlink()
    (path / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    assert load_model(str(path)).tokenizer.chat_template == template == byte_tokenizer().chat_template


def test_served_text_only_and_images_refused_naming_the_model(tmp_path):
    """Served over HTTP: a chat in text is answered; an image part is refused naming the model as text only."""
    import httpx

    from oscarkv.config import ServerConfig
    from tests.server.conftest import start

    loaded = load_model(str(write_checkpoint(tmp_path / "gemma-mm")))
    chat = {"model": "gemma-3-mm", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    image = {**chat, "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                                                {"type": "image_url", "image_url": {"url": "http://x"}}]}]}
    with start(loaded.model, loaded.tokenizer, ServerConfig(served_model_name="gemma-3-mm")) as s:
        ok = httpx.post(s.url + "/v1/chat/completions", json=chat, timeout=30)
        refused = httpx.post(s.url + "/v1/chat/completions", json=image, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
    assert refused.status_code == 400, refused.text
    assert "images are not supported: 'gemma-3-mm' is served text only here" in refused.json()["error"]["message"]
