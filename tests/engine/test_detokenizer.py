"""Incremental detokenization equals decoding the whole output, at a few tokens' decode per step.

References: ``tokenizer.decode(ids, skip_special_tokens=True)`` of the whole output after every
token, cut before the first stop string — what the engine computed before it decoded
incrementally. Tokenizers: the byte-level one of the server tests (256 byte tokens, so random
sequences are full of partial and invalid UTF-8, plus special tokens) and the default model's
(SmolLM2's byte-level BPE, 49K tokens). The cost is asserted as tokens decoded per step (a
count, not a time): flat in the output length.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oscarkv.engine.detokenizer import Detokenizer, IncrementalText
from oscarkv.engine.request import SamplingParams
from oscarkv.engine.engine import LLMEngine
from tests.engine.conftest import engine_config, make_engine, prompts, run
from tests.byte_llama import byte_tokenizer

BYTES = byte_tokenizer()
UNICODE = "naïve café — 日本語のテキスト 🙂👍🏽 ½ ∑ Ωmega\n\tend."


def reference(tok, ids: list[int], stop: tuple[str, ...] = ()) -> tuple[str, int | None]:
    """(text, tokens consumed when a stop string ended it, else None) by whole-output decoding."""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k], skip_special_tokens=True)
        hits = [at for at in (text.find(s) for s in stop) if at >= 0]
        if hits:
            return text[:min(hits)], k
    return tok.decode(ids, skip_special_tokens=True), None


def feed(tok, ids: list[int], stop: tuple[str, ...] = (), every_step: bool = True) -> tuple[str, int | None]:
    """Feed ``ids`` one by one; checks the text against the whole decode after every token."""
    inc = IncrementalText(Detokenizer(tok), stop)
    for k, t in enumerate(ids, 1):
        if inc.add(t):
            return inc.text, k
        if every_step:
            assert inc.text == tok.decode(ids[:k], skip_special_tokens=True)
    return inc.text, None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, len(BYTES) - 1), max_size=40))
def test_byte_tokenizer_random_sequences(ids):
    assert feed(BYTES, ids) == (BYTES.decode(ids, skip_special_tokens=True), None)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, len(BYTES) - 1), min_size=1, max_size=40), st.data())
def test_byte_tokenizer_stop_strings(ids, data):
    """Stop strings drawn from the output itself (and one absent), in any order: stopped at the same
    token, cut at the first occurrence."""
    text = BYTES.decode(ids, skip_special_tokens=True)
    stops = []
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, max(0, len(text) - 1)))
        stops.append(text[i:i + data.draw(st.integers(1, 4))] or "x")
    stop = tuple(stops) + ("never-there",)
    assert feed(BYTES, ids, stop, every_step=False) == reference(BYTES, ids, stop)


def test_default_tokenizer_random_and_real_sequences(default_tokenizer):
    tok = default_tokenizer
    import random

    rng = random.Random(0)
    for _ in range(40):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 60))]
        assert feed(tok, ids) == (tok.decode(ids, skip_special_tokens=True), None)
    real = tok(UNICODE + " The end<|im_end|> after", add_special_tokens=False).input_ids
    assert feed(tok, real) == (tok.decode(real, skip_special_tokens=True), None)
    # multi-byte characters split across tokens: the text never streams a replacement character
    assert "\ufffd" not in feed(tok, real)[0]
    for stop in (("日本",), ("🙂",), ("end", "—"), ("\n\t",)):
        assert feed(tok, real, stop, every_step=False) == reference(tok, real, stop)


class CountingTokenizer:
    """Forwards to a tokenizer, counting the token ids each ``decode`` call is given."""

    def __init__(self, tok) -> None:
        self.tok, self.counts = tok, []

    def decode(self, ids, skip_special_tokens=False):
        self.counts.append(len(ids))
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


def test_tokens_decoded_per_step_are_flat(default_tokenizer):
    """2,000+ tokens of text (English, then every 50 lines the Unicode line): each step decodes at most a
    handful of ids, the same at the end of the output as at its start (decoding the whole output
    would decode k ids at step k)."""
    from importlib.resources import files

    lines = files("oscarkv.data").joinpath("eval.txt").read_text().splitlines()[:1200]
    text = "\n".join(line if i % 50 else UNICODE for i, line in enumerate(lines))
    ids = default_tokenizer(text, add_special_tokens=False).input_ids[:2400]
    counting = CountingTokenizer(default_tokenizer)
    inc = IncrementalText(Detokenizer(counting))
    per_step = []
    for t in ids:
        n = len(counting.counts)
        inc.add(t)
        per_step.append(sum(counting.counts[n:]))
    assert inc.text == default_tokenizer.decode(ids, skip_special_tokens=True)
    first, last = per_step[:len(ids) // 2], per_step[len(ids) // 2:]
    assert max(per_step) <= 12 and max(last) <= max(first) + 2
    assert sum(last) / len(last) < 4


def test_engine_streams_equal_whole_decoding(llama):
    """Through the engine with the byte tokenizer (its ids cover the tiny model's 128, printable
    ASCII and stray UTF-8 bytes): the deltas add up to the text, which equals the whole decode
    cut at the stop string, and the tokens end where that decode first holds it."""
    p = prompts(2, 20, seed=4)
    free = run(make_engine(llama, "bf16"), p)
    stop = (BYTES.decode(free[0].token_ids[6:8]),)
    params = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=stop),
              SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)]
    engine = LLMEngine.from_hf(llama, engine_config("bf16"), None, BYTES)
    for i, q in enumerate(p):
        engine.add_request(str(i), q, params[i])
    streamed, finals = {"0": "", "1": ""}, {}
    while engine.has_unfinished():
        for out in engine.step():
            streamed[out.request_id] += out.new_text
            if out.finished:
                finals[out.request_id] = out
    for i, o in finals.items():
        want, k = reference(BYTES, free[int(i)].token_ids, params[int(i)].stop)
        assert o.text == streamed[i] == want and o.token_ids == free[int(i)].token_ids[:k]
    assert finals["0"].finish_reason == "stop" and finals["1"].finish_reason == "length"


@pytest.mark.parametrize("stop", [(), ("é",)])
def test_partial_utf8_is_held_back_from_the_stream(stop):
    """'é' is two byte tokens: after the first the text ends in U+FFFD, which is not streamed."""
    ids = BYTES("aé b", add_special_tokens=False).input_ids
    assert len(ids) == 5
    inc = IncrementalText(Detokenizer(BYTES), stop)
    inc.add(ids[0]), inc.add(ids[1])
    assert inc.text == "a\ufffd" and inc.holdback == 1
    assert inc.add(ids[2]) == bool(stop) and inc.text == ("a" if stop else "aé") and inc.holdback == 0
