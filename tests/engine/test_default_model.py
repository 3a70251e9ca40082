"""The real default model (SmolLM2-135M, fp32 on the CPU): kv=bf16 greedy ≡ transformers over 64 tokens.

A fixed set of prompts — raw text of several lengths, code, and the chat template with one and
several turns — runs through the engine in one batch; each prompt's 64 greedy tokens must equal
``model.generate`` (greedy, one prompt at a time, no padding) token for token.

NOTE: the engine runs with ``ignore_eos`` so every prompt yields 64 tokens; the reference then
must not stop at (nor suppress) EOS either — ``min_new_tokens`` would mask EOS out of the argmax
and diverge where the model picks it — so it gets an empty ``eos_token_id`` list.
"""

import pytest
import torch
from transformers import GenerationConfig

from oscarkv.config import EngineConfig, KVConfig
from oscarkv.engine.engine import LLMEngine
from tests.engine.conftest import run

NEW_TOKENS = 64
RAW = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Once upon a time, in a small village at the edge of a vast forest, there lived an old woodcutter "
    "and his three children. Every morning he",
]
CHATS = [
    [{"role": "user", "content": "List three uses of a paperclip."}],
    [{"role": "system", "content": "You are a concise assistant who answers in full sentences."},
     {"role": "user", "content": "What is the boiling point of water at sea level, in Celsius and in Fahrenheit?"},
     {"role": "assistant", "content": "Water boils at 100 degrees Celsius, which is 212 degrees Fahrenheit, at sea level."},
     {"role": "user", "content": "And why does it boil at a lower temperature on a high mountain? Explain it step by step."}],
]


def prompt_ids(tok) -> list[list[int]]:
    """Raw prompts with the tokenizer's special tokens, chats through its template (lengths 5 to ~110)."""
    chats = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in CHATS]
    return [tok(p).input_ids for p in RAW] + [tok(c, add_special_tokens=False).input_ids for c in chats]


@torch.no_grad()
def hf_generate(model, ids: list[int]) -> list[int]:
    gc = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=[], pad_token_id=0)
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         generation_config=gc)
    return out[0, len(ids):].tolist()


@pytest.mark.slow
def test_default_model_bf16_matches_transformers():
    from oscarkv.engine.request import SamplingParams
    from oscarkv.models.loader import load_model

    loaded = load_model("default", torch.float32)
    ids = prompt_ids(loaded.tokenizer)
    assert len({len(p) for p in ids}) == len(ids) and max(len(p) for p in ids) > 64  # crosses the sink and a page
    cfg = EngineConfig(KVConfig("bf16"), kv_memory_bytes=1 << 26, max_num_seqs=len(ids))
    engine = LLMEngine.from_hf(loaded.model, cfg, None, loaded.tokenizer)
    outs = run(engine, ids, SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True))
    for i, (p, out) in enumerate(zip(ids, outs)):
        ref = hf_generate(loaded.model, p)
        assert len(ref) == NEW_TOKENS
        first = next((k for k, (a, b) in enumerate(zip(out.token_ids, ref)) if a != b), None)
        assert out.token_ids == ref, f"prompt {i} ({len(p)} tokens) diverges at new token {first}"


def test_turn_marker_of_the_default_chat_template():
    """The default model's template ends a prompt with ``<|im_start|>assistant\\n``: a follow-up chat's earlier turn
    ends where that occurs, exactly at the first turn's prompt length."""
    from oscarkv.engine.admission import turn_ends, turn_marker
    from oscarkv.models.loader import load_model

    tok = load_model("default", torch.float32).tokenizer
    marker = turn_marker(tok)
    assert tok.decode(list(marker)) == "<|im_start|>assistant\n"
    chat = CHATS[1]
    first = tok(tok.apply_chat_template(chat[:2], tokenize=False, add_generation_prompt=True),
                add_special_tokens=False).input_ids
    whole = tok(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True), add_special_tokens=False).input_ids
    assert whole[:len(first)] == first and turn_ends(whole, marker) == (len(first), len(whole))



def test_line_starts_of_the_default_tokenizer():
    """A document and a question in one chat message: the last line start before the assistant prefix is the
    question's first token (the newline after ``<|im_end|>`` is followed by a special token: not a line start)."""
    import numpy as np

    from oscarkv.engine.admission import LineStarts, turn_marker
    from oscarkv.models.loader import load_model

    tok = load_model("default", torch.float32).tokenizer
    lines, marker = LineStarts.of(tok), turn_marker(tok)
    msg = [{"role": "user", "content": "The harbour lies east.\nThe pier is old.\n\nQuestion: where is the pier?"}]
    ids = tok(tok.apply_chat_template(msg, tokenize=False, add_generation_prompt=True), add_special_tokens=False).input_ids
    p = lines.last(np.array(ids), len(ids) - len(marker))
    assert tok.decode(ids[p:p + 1]) == "Question" and lines.last(np.array(ids), len(ids)) == p
    assert lines.special[tok.convert_tokens_to_ids("<|im_start|>")] and lines.newline[tok("\n").input_ids[0]]
