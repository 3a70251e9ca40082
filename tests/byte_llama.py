"""A tiny random Llama with a byte-level tokenizer and chat template, and the engine flags small enough
for it: the model of the server, command-line and detokenizer tests. Imports nothing of the server (so
the engine's tests collect where the ``serve`` extra is not installed); ``tests.server.conftest``
re-exports it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.engine.conftest import tiny_config

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SPECIAL = ["<|eos|>", "<|user|>", "<|assistant|>", "<|system|>"]

SMALL = ["--sink", "8", "--recent", "16", "--page-size", "8", "--prefill-chunk", "64",
         "--max-num-batched-tokens", "80", "--max-num-seqs", "4", "--kv-memory-bytes", str(1 << 22)]
"""Engine flags small enough for the tiny model (``oscarkv serve``/``generate`` tests)."""


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


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, model, tok):
    """The tiny model saved as a Hugging Face directory (what ``oscarkv serve --model DIR`` loads)."""
    path = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
