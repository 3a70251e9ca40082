"""Tiny random models (Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Gemma 3), an OSCAR artifact for them, and engine factories."""

from dataclasses import asdict

import pytest
import torch
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config,
                          Qwen3MoeConfig)

from oscarkv.cache.hf_cache import cache_kwargs
from oscarkv.config import EngineConfig, KVConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from oscarkv.quant.artifact import FORMAT_VERSION, Artifact, ModelFingerprint

L, HKV, D, VOCAB = 2, 2, 32, 128
WINDOWS = dict(sink=8, recent=16, page_size=8)
CONFIGS = {"LlamaForCausalLM": LlamaConfig, "Qwen2ForCausalLM": Qwen2Config, "Qwen3ForCausalLM": Qwen3Config,
           "MistralForCausalLM": MistralConfig, "Qwen3MoeForCausalLM": Qwen3MoeConfig,
           "Gemma3ForCausalLM": Gemma3TextConfig}
EXTRA = {"MistralForCausalLM": dict(sliding_window=None),
         "Qwen3MoeForCausalLM": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                                     norm_topk_prob=True, mlp_only_layers=[1]),  # layer 0 sparse, layer 1 dense
         "Gemma3ForCausalLM": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=12,
                                   query_pre_attn_scalar=24, final_logit_softcapping=30.0,
                                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                                    "full_attention": {"rope_type": "default", "rope_theta": 1e6}})}
"""Per-architecture fields of the tiny configs (no window, except Gemma 3's sliding layer 0 of 12 tokens; a MoE
with a sparse and a dense layer)."""


def tiny_config(arch: str = "LlamaForCausalLM", **kw):
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=L, num_attention_heads=4,
                num_key_value_heads=HKV, head_dim=D, vocab_size=VOCAB, architectures=[arch],
                tie_word_embeddings=False)
    config = CONFIGS[arch](**{**base, **EXTRA.get(arch, {}), **kw})
    config._attn_implementation = "sdpa"
    return config


def tiny_model(arch: str = "LlamaForCausalLM", seed: int = 0):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch)).eval()
    with torch.no_grad():  # larger weights: peaky, well separated logits (fewer near-ties)
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.15)
    return model


def make_artifact(config, seed: int = 1) -> Artifact:
    """Random orthogonal rotations, means and clips, like ``oscarkv calibrate`` writes them."""
    g, H = torch.Generator().manual_seed(seed), config.num_key_value_heads
    q = torch.linalg.qr(torch.randn(L, H, D, D, generator=g))[0]
    tensors = {}
    for kind in ("key", "value"):
        tensors |= {f"{kind}.rotation": q, f"{kind}.eigvecs": q,
                    f"{kind}.mean": 0.3 * torch.randn(L, H, D, generator=g),
                    f"{kind}.eigenvalues": torch.rand(L, H, D, generator=g).sort(-1, descending=True).values}
    manifest = {"format_version": FORMAT_VERSION, "oscarkv_version": "test",
                "model": asdict(ModelFingerprint.from_config(config)), "method": "oscar", "options": {},
                "group_size": D, "clip": {"key": [0.9] * L, "value": [1.0] * L}, "calibration": {}}
    art = Artifact(manifest, tensors)
    art.validate()
    return art


@pytest.fixture(scope="session")
def llama():
    return tiny_model()


@pytest.fixture(scope="session")
def artifact(llama):
    return make_artifact(llama.config)


def engine_config(method: str = "oscar", **kw) -> EngineConfig:
    base = dict(kv=KVConfig(method, group_size=D if method != "bf16" else None, **WINDOWS),
                kv_memory_bytes=1 << 22, max_num_seqs=8, max_num_batched_tokens=80, prefill_chunk=64)
    return EngineConfig(**{**base, **kw})


def make_engine(model, method: str = "oscar", artifact=None, **kw) -> LLMEngine:
    return LLMEngine.from_hf(model, engine_config(method, **kw), artifact if method == "oscar" else None)


def run(engine: LLMEngine, prompts, params=None, on_step=None) -> list:
    """All prompts to completion; outputs in prompt order. With a tokenizer, each output's text is
    checked against decoding its whole output at once (the engine decodes incrementally)."""
    params = params or SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=True)
    params = [params] * len(prompts) if isinstance(params, SamplingParams) else params
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params[i])
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        if on_step:
            on_step(engine)
    outs = [done[str(i)] for i in range(len(prompts))]
    for out, p in zip(outs, params) if engine.tokenizer is not None else ():
        assert out.text == whole_text(engine.tokenizer, out.token_ids, p.stop)
    return outs


def whole_text(tokenizer, token_ids: list[int], stop: tuple[str, ...] = ()) -> str:
    """``token_ids`` decoded at once (special tokens skipped), cut before the first stop string."""
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    return text[:min((at for at in (text.find(s) for s in stop) if at >= 0), default=len(text))]


def fail_once(monkeypatch, obj, name: str) -> list:
    """Make ``obj.name`` raise ``RuntimeError("injected failure")`` on its next call only; the
    returned list receives that call's positional arguments."""
    real, seen = getattr(obj, name), []

    def boom(*args, **kw):
        if not seen:
            seen.append(args)
            raise RuntimeError("injected failure")
        return real(*args, **kw)

    monkeypatch.setattr(obj, name, boom)
    return seen


def prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (length + 3 * i,), generator=g).tolist() for i in range(n)]


@torch.no_grad()
def hf_greedy(model, prompt: list[int], n: int, cache, chunk: int | None = None) -> tuple[list[int], list[float]]:
    """Reference: greedy decoding with transformers and ``cache`` (prompt fed in chunks of ``chunk``)."""
    ids, toks, lps = list(prompt), [], []
    chunk = chunk or len(prompt)
    for s in range(0, len(prompt), chunk):
        e = min(s + chunk, len(prompt))
        logits = model(torch.tensor([ids[s:e]]), **cache_kwargs(cache), position_ids=torch.arange(s, e)[None]).logits
    for _ in range(n):
        logp = torch.log_softmax(logits[0, -1].float(), -1)
        t = int(logp.argmax())
        toks.append(t)
        lps.append(float(logp[t]))
        ids.append(t)
        logits = model(torch.tensor([[t]]), **cache_kwargs(cache), position_ids=torch.tensor([[len(ids) - 1]])).logits
    return toks, lps
