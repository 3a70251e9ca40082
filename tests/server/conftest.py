"""A tiny random Llama with a byte-level tokenizer and chat template, served on a loopback port.

Most server tests run against this model (fast on the CPU); ``offline`` gives the greedy
tokens the engine produces without HTTP, the reference the served outputs must equal.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from oscarkv.engine.async_engine import AsyncEngine
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from oscarkv.server.app import create_app, served_model
from oscarkv.server.launch import serving_in_thread
from oscarkv.config import ServerConfig
from tests.engine.conftest import engine_config, run, tiny_config

MODEL = "tiny"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SPECIAL = ["<|eos|>", "<|user|>", "<|assistant|>", "<|system|>"]


def byte_tokenizer():
    """Byte-level BPE without merges (256 byte tokens + 4 specials) and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab |= {s: len(vocab) + i for i, s in enumerate(SPECIAL)}
    tk = Tokenizer(models.BPE(vocab, []))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=SPECIAL[0], additional_special_tokens=SPECIAL[1:])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def byte_model(seed: int = 0):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(vocab_size=len(SPECIAL) + 256, eos_token_id=256,
                                                         max_position_embeddings=512)).eval()
    with torch.no_grad():  # peaky logits, as tests/engine does: fewer near-ties between tokens
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.15)
    return model


@pytest.fixture(scope="session")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="session")
def model():
    return byte_model()


SMALL = ["--sink", "8", "--recent", "16", "--page-size", "8", "--prefill-chunk", "64",
         "--max-num-batched-tokens", "80", "--max-num-seqs", "4", "--kv-memory-bytes", str(1 << 22)]
"""Engine flags small enough for the tiny model (``oscarkv serve``/``generate`` tests)."""


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, model, tok):
    """The tiny model saved as a Hugging Face directory (what ``oscarkv serve --model DIR`` loads)."""
    path = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def make_engine(model, tok, method: str = "bf16", artifact=None, **kw) -> LLMEngine:
    return LLMEngine.from_hf(model, engine_config(method, **kw), artifact, tok)


class Served:
    """A running server: its base URL, the async engine and the app."""

    def __init__(self, url: str, engine: AsyncEngine, app) -> None:
        self.url, self.engine, self.app = url, engine, app

    @property
    def llm(self) -> LLMEngine:
        return self.engine.engine

    def idle(self) -> bool:
        e = self.llm
        used = e.manager.bf16.num_used + (e.manager.int2.num_used if e.manager.int2 else 0)
        return not e.has_unfinished() and used == 0


def start(model, tok, cfg: ServerConfig | None = None, method: str = "bf16", artifact=None, **kw):
    """Context manager: serve ``model`` on a free loopback port; yields a :class:`Served`."""
    from contextlib import contextmanager

    @contextmanager
    def _cm():
        llm = make_engine(model, tok, method, artifact, **kw)
        engine = AsyncEngine(llm)
        scfg = cfg or ServerConfig(served_model_name=MODEL, default_max_tokens=16)
        app = create_app(engine, served_model(llm, model.config, tok, scfg.served_model_name, scfg), scfg)
        try:
            with serving_in_thread(app) as url:
                yield Served(url, engine, app)
        finally:
            engine.close()

    return _cm()


@pytest.fixture(scope="module")
def served(model, tok):
    with start(model, tok) as s:
        yield s


def offline(model, tok, prompts: list[list[int]], max_tokens: int, method: str = "bf16", artifact=None,
            ignore_eos: bool = False, **kw) -> list:
    """Greedy outputs of the engine without HTTP (a fresh engine, the same config)."""
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=ignore_eos)
    return run(make_engine(model, tok, method, artifact, **kw), prompts, sp)


def wait_idle(served: Served, timeout: float = 10.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if served.idle():
            return True
        time.sleep(0.02)
    return served.idle()
