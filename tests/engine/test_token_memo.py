"""``TokenMemo``: a text that repeats an earlier one up to an added token encodes only the rest, and its ids are
exactly the tokenizer's own — for chats that grow, edit an earlier turn, start over or interleave, with the default
model's tokenizer and with trained tokenizers of other kinds; a tokenizer that is not local is never cut."""

from __future__ import annotations

import random
from importlib import resources

import pytest
from hypothesis import given, settings, strategies as st

from oscarkv.engine import token_memo
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
    """No added token inside: a document asked about again as plain text is cut at a kept line start (``LINE_GAP``
    apart), exactly; a text that parts before the first kept line start is encoded whole."""
    memo = TokenMemo(default_tokenizer)
    assert memo.lines
    asks = [DOC[:9000] + q for q in ("\n\nQuestion: where?", "\nQuestion: who?", " and more", "\n  (why)")]
    check(memo, default_tokenizer, asks + [DOC[:1000] + "x" + DOC[1001:9000]], special=True)
    assert memo.reused > 3 * len(default_tokenizer(DOC[:6000]).input_ids)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_line_cuts_are_exact_on_edited_texts(default_tokenizer, data):
    """Texts full of line ends (spaces, punctuation, digits, ``\\r``, blank lines, accents) and edits at random
    places: every text encodes to the tokenizer's own ids, cut at line starts a few characters apart."""
    alphabet = st.sampled_from(["\n", "\r\n", " ", "  ", ".", "é", "3", "ab", "The", "(x)", "'s", "\t", "\n\n", "Ω"])
    base = "".join(data.draw(st.lists(alphabet, min_size=30, max_size=80)))
    memo = TokenMemo(default_tokenizer)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(token_memo, "MIN_CHARS", 8)
        mp.setattr(token_memo, "LINE_GAP", 3)
        for _ in range(4):
            at = data.draw(st.integers(0, len(base)))
            base = base[:at] + "".join(data.draw(st.lists(alphabet, max_size=6)))
            check(memo, default_tokenizer, [base], special=data.draw(st.booleans()))


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
        "byte-bpe": (models.BPE(), trainers.BpeTrainer(vocab_size=600, special_tokens=special,  # every byte: real ones do
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
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
    assert memo.enabled and memo.lines == (kind == "byte-bpe")  # line cuts: byte-level BPE over regex pieces only
    texts = list(chat_texts(tok, range(2)))
    texts += [texts[1] + "<x> and", texts[1] + "<x>and more </s>"]  # an added token matched after normalizing
    texts += [DOC[:9000] + "\nWhere?", DOC[:9000] + "\n Who?"]  # a plain document asked about again
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


@pytest.mark.parametrize("pre", ["spaces", "no-regex", "prefix-space"])
def test_no_line_cuts_where_pieces_or_merges_may_span_a_line_start(pre):
    """Byte-level BPEs whose pieces are not GPT-2's or Llama 3's regex (split at spaces only, or not split) learn
    merges across line starts (``.ĊThe``): never cut at lines. One that prefixes a space cannot cut at all."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    byte = pre_tokenizers.ByteLevel(add_prefix_space=pre == "prefix-space", use_regex=pre == "prefix-space")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(" "), "merged_with_next"), byte]) \
        if pre == "spaces" else byte
    tk.train_from_iterator([DOC[i:i + 2000] for i in range(0, 100000, 2000)],
                           trainers.BpeTrainer(vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk)
    joins = [t for t in tok.get_vocab() if token_memo._LINE_JOIN.search(t)]
    assert bool(joins) == (pre != "prefix-space")
    memo = TokenMemo(tok)
    assert not memo.lines and not memo.enabled
    check(memo, tok, [DOC[:9000] + "\nWhere?", DOC[:9000] + "\nWho?"], special=False)


def test_line_cuts_with_a_split_pattern_of_qwens_kind():
    """Pieces from a Split pattern of Qwen's / Llama 3's kind beside a byte-level BPE: line cuts on, exact."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), "isolated"),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.train_from_iterator([DOC[i:i + 2000] for i in range(0, 100000, 2000)],
                           trainers.BpeTrainer(vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk)
    memo = TokenMemo(tok)
    assert memo.lines
    check(memo, tok, [DOC[:9000] + "\nWhere?", DOC[:9000] + "\nWho is it?", DOC[:9000] + ".\n\n  (why)"], special=False)
    assert memo.reused > 0
