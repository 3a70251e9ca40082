"""``TokenMemo``: a text that repeats an earlier one up to an added token encodes only the rest, and its ids are
exactly the tokenizer's own — for chats that grow, edit an earlier turn, start over or interleave, with the default
model's tokenizer and with trained tokenizers of other kinds; a tokenizer that is not local is never cut."""

from __future__ import annotations

import random
from importlib import resources

import pytest
from hypothesis import given, strategies as st

from oscarkv.engine.token_memo import TokenMemo, common_prefix

DOC = resources.files("oscarkv.data").joinpath("gazetteer.txt").read_text()


def conversations(seed: int, turns: int = 4):
    """Chat message lists as a client sends them: one document question, then answer + question turns; now and
    then an earlier turn edited, or a new conversation on another document (texts >= MIN_CHARS)."""
    rng = random.Random(seed)
    start = rng.randrange(len(DOC) - 12000)
    msgs = [{"role": "user", "content": DOC[start:start + rng.randrange(5000, 12000)] + "\nWhere is the harbour?"}]
    for t in range(turns):
        yield list(msgs)
        msgs += [{"role": "assistant", "content": f"Answer {t}: east of the {rng.choice(['town', 'bay', ' pier'])}."},
                 {"role": "user", "content": rng.choice(["And then?", " Why?", "More\n", f"Question {t}: who?"])}]
        if rng.random() < 0.25:  # an earlier turn edited: the texts differ inside the conversation
            i = rng.randrange(1, len(msgs))
            msgs[i] = {**msgs[i], "content": msgs[i]["content"] + " (edited)"}


def check(memo: TokenMemo, tok, texts, special: bool) -> None:
    for text in texts:
        assert memo.encode(text, special) == tok(text, add_special_tokens=special).input_ids


def chat_texts(tok, seeds):
    for seed in seeds:
        for msgs in conversations(seed):
            yield tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_default_tokenizer_chats_encode_exactly_and_reuse(default_tokenizer):
    tok = default_tokenizer
    memo = TokenMemo(tok)
    assert memo.enabled and memo.reach > len("<|im_start|>")
    texts = list(chat_texts(tok, range(3)))
    check(memo, tok, texts, special=False)
    assert memo.reused > sum(len(tok(t).input_ids) for t in texts[1:4]) // 2  # follow-ups came from held ids
    check(memo, tok, [texts[0], texts[5], texts[1], texts[9], texts[2] + "<|im_end|>\n<|im_start|>user\nx"], special=True)


def test_default_tokenizer_plain_documents_encode_exactly(default_tokenizer):
    """No added token inside: whole texts (nothing to cut at), still exactly the tokenizer's ids."""
    memo = TokenMemo(default_tokenizer)
    check(memo, default_tokenizer, [DOC[:6000], DOC[:6000] + " more", DOC[:7000]], special=True)
    assert memo.reused == 0


def test_cut_texts_differing_right_after_an_added_token(default_tokenizer):
    """The held text and the new one agree up to an added token and ``reach`` characters more, or one less."""
    tok, memo = default_tokenizer, TokenMemo(default_tokenizer)
    base = DOC[:6000] + "<|im_end|>"
    for tail in ("\n<|im_start|>user\nhi", "\n<|im_start|>", "<|im_end|>x", "<|im_start|><|im_end|>", " <|im_end|>"):
        check(memo, tok, [base + "\n<|im_start|>assistant\nA long answer.", base + tail], special=False)
    word = DOC[:6000].rstrip() + " harbour"  # the new text goes on where the held one had an added token
    for tail in ("s and piers", "ing", "<|im_e", "\n"):
        check(memo, tok, [word + "<|im_end|>\n<|im_start|>assistant\nA long answer.", word + tail], special=False)


def trained_tokenizers():
    """Tokenizers of other kinds trained on the gazetteer, each with added special tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<s>", "</s>", "<|user|>", "<|assistant|>"]
    kinds = {
        "byte-bpe": (models.BPE(), trainers.BpeTrainer(vocab_size=600, special_tokens=special),
                     None, pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()),
        "metaspace-unigram": (models.Unigram(), trainers.UnigramTrainer(vocab_size=400, special_tokens=special,
                                                                        unk_token="</s>"),
                              normalizers.NFKC(), pre_tokenizers.Metaspace(), decoders.Metaspace()),
        "wordpiece-lower": (models.WordPiece(unk_token="</s>"),
                            trainers.WordPieceTrainer(vocab_size=500, special_tokens=special),
                            normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer(), None),
    }
    out = {}
    for name, (model, trainer, norm, pre, dec) in kinds.items():
        tk = Tokenizer(model)
        tk.normalizer, tk.pre_tokenizer = norm, pre
        if dec is not None:
            tk.decoder = dec
        tk.train_from_iterator([DOC[i:i + 2000] for i in range(0, 60000, 2000)], trainer)
        if name == "wordpiece-lower":  # its special tokens go at both ends: add_special_tokens texts are never cut
            tk.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0),
                                                                                                   ("</s>", 1)])
        elif name == "byte-bpe":
            tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
        tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                      additional_special_tokens=special[2:])
        tok.add_tokens(["<x>"])  # normalized: matched inside pieces, never cut at
        tok.chat_template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}"
                             "{% if add_generation_prompt %}<|assistant|>{% endif %}")
        out[name] = tok
    return out


@pytest.fixture(scope="module")
def trained():
    return trained_tokenizers()


@pytest.mark.parametrize("kind", ["byte-bpe", "metaspace-unigram", "wordpiece-lower"])
def test_trained_tokenizers_encode_exactly(trained, kind):
    tok = trained[kind]
    memo = TokenMemo(tok)
    assert memo.enabled
    texts = list(chat_texts(tok, range(2)))
    texts += [texts[1] + "<x> and", texts[1] + "<x>and more </s>"]  # an added token matched after normalizing
    for special in (False, True):
        check(memo, tok, texts, special)
    assert memo.reused > 0


class _Global:
    """A fast-looking tokenizer whose ids depend on the whole text (its length's parity): never local."""

    is_fast, chat_template = True, None
    added_tokens_decoder = {0: type("T", (), {"content": "<|x|>", "normalized": False})()}

    def __call__(self, text, add_special_tokens=True):
        ids = [0 if text.startswith("<|x|>", i) else 2 + ord(c) % 50 + len(text) % 2 for i, c in enumerate(text)]
        spans = list(range(len(text)))
        return type("E", (), {"input_ids": ids, "token_to_chars": lambda self, k: type("S", (), {"start": spans[k]})()})()


def test_a_tokenizer_the_probe_refutes_is_never_cut():
    memo = TokenMemo(_Global())
    assert not memo.enabled
    text = "a" * 5000 + "<|x|>" + "b" * 10
    assert memo.encode(text + "c") == _Global()(text + "c").input_ids and memo.encode(text + "cd")[-1] != 0


@given(st.text("ab\n<", max_size=40), st.text("ab\n<", max_size=40), st.text("ab\n<", max_size=40),
       st.integers(1, 16))
def test_common_prefix_is_the_shared_length(a, x, y, block):
    s, t = a + x, a + y
    want = next((i for i, (c, d) in enumerate(zip(s, t)) if c != d), min(len(s), len(t)))
    assert common_prefix(s, t, block) == want
    assert common_prefix(tuple(map(ord, s)), tuple(map(ord, t)), block) == want


def test_never_cut_where_a_longer_added_token_could_overlap():
    """Added tokens ``<a>`` and ``x<a>`` + 20 ``y`` (the longest): a held ``…x<a>`` + 19 ``y`` + ``q`` matched ``<a>``;
    a new text with 20 ``y`` matches the longer token a character before — cutting at ``<a>`` would split it, so
    texts sharing less than the longest added token's length from ``<a>`` on are not cut there."""
    from tokenizers import AddedToken

    from tests.byte_llama import byte_tokenizer

    tok, long = byte_tokenizer(), "x<a>" + "y" * 20
    tok.add_tokens([AddedToken("<a>", normalized=False), AddedToken(long, normalized=False)])
    memo = TokenMemo(tok)
    assert memo.enabled and memo.reach == len(long)
    head = DOC[:5000] + "<|user|>" + DOC[5000:5100]
    check(memo, tok, [head + long[:-1] + "q and more", head + long + " and more", head + long + "y"], special=False)


def test_a_tokenizer_whose_probe_fails_encodes_whole_texts():
    """A tokenizer that looks fast but cannot give character spans: the engine still starts, texts are encoded
    whole."""

    class NoSpans(_Global):
        def __call__(self, text, add_special_tokens=True):
            enc = super().__call__(text, add_special_tokens)
            enc.token_to_chars = lambda k: (_ for _ in ()).throw(NotImplementedError("no offsets"))
            return enc

    memo = TokenMemo(NoSpans())
    assert not memo.enabled and memo.encode("x" * 5000) == NoSpans()("x" * 5000).input_ids


def test_many_conversations_each_keep_their_last_turn(default_tokenizer):
    """A server interleaves conversations: with room for them, each one's next turn reuses its last; over the
    token budget the oldest go first (and their next turn is encoded whole, still exactly)."""
    tok = default_tokenizer
    chats = [list(conversations(seed, turns=2)) for seed in range(6)]
    texts = [[tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in c] for c in chats]
    reused = {}
    for budget in (1 << 21, 4000):  # room for all, then for one text (every chat starts with the same system turn)
        memo = TokenMemo(tok, max_tokens=budget)
        for t in (t for turn in zip(*texts) for t in turn):  # turn 1 of every chat, then turn 2 of every chat
            check(memo, tok, [t], special=False)
        reused[budget] = memo.reused
        held = memo._held[False]
        assert len(held) >= 6 if budget > 4000 else (len(held) == 1 or sum(len(h.ids) for h in held) <= budget)
    assert reused[1 << 21] > 10 * reused[4000]
