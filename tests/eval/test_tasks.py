"""Synthetic tasks: answers are findable exactly once, lengths hit the band, generation is deterministic."""

from __future__ import annotations

import pytest

from oscarkv.eval import tasks as T
from oscarkv.eval.perplexity_data import max_windows, text_windows

NIAH = tuple(t for t in T.TASKS if t != "vt")


@pytest.fixture(scope="module")
def tok(default_tokenizer):
    return default_tokenizer


def n_tokens(tok, s: T.Sample) -> int:
    return len(tok(s.document + s.question, add_special_tokens=False).input_ids)


@pytest.mark.parametrize("context", [1024, 2048])
@pytest.mark.parametrize("task", T.TASKS)
def test_length_band_and_template(tok, task, context):
    for s in T.generate(task, context, 3, tok, seed=1):
        assert context - T.MARGIN <= n_tokens(tok, s) <= context
        assert (s.task, s.context, s.seed) == (task, context, 1)
        full = s.document + s.question
        assert full.startswith("<|im_start|>") and "<|im_start|>assistant\n" in s.question
        assert s.question.startswith("\n\n") and "<|im_start|>" not in s.document.split("<|im_start|>user\n")[1]


@pytest.mark.parametrize("haystack", ["eval", "calibration"])
@pytest.mark.parametrize("task", NIAH)
def test_niah_answers_and_keys_once(tok, task, haystack):
    for s in T.generate(task, 1024, 4, tok, seed=2, haystack=haystack):
        needles = [line for line in s.document.split("\n") if line.startswith("One of the special magic numbers")]
        assert len(needles) == (1 if task == "niah_single" else 4)
        for a in s.answers:
            assert s.document.count(a) == 1
        keys = [n.split(" for ")[1].split(" is: ")[0] for n in needles]
        for k in set(keys):
            assert s.document.count(k) == keys.count(k)  # only inside its needles
            assert k in s.question or task == "niah_multikey"
        values = [n.rsplit(" ", 1)[1].rstrip(".") for n in needles]
        assert len(set(values)) == len(values)  # distractors never equal a gold answer


def test_niah_answer_order(tok):
    for s in T.generate("niah_multivalue", 1024, 3, tok):
        pos = [s.document.index(a) for a in s.answers]
        assert pos == sorted(pos)  # document order
    for s in T.generate("niah_multiquery", 1024, 3, tok):
        keys = s.question.split("numbers for ")[1].split(" mentioned")[0].replace(" and ", ", ").split(", ")
        for k, a in zip(keys, s.answers):
            assert f"for {k} is: {a}." in s.document  # asked order


def test_multikey_has_three_distractors(tok):
    for s in T.generate("niah_multikey", 1024, 3, tok):
        key = s.question.split("number for ")[1].split(" mentioned")[0]
        assert f"for {key} is: {s.answers[0]}." in s.document
        assert s.document.count("One of the special magic numbers for ") == 4


def test_vt_chain(tok):
    for s in T.generate("vt", 1024, 4, tok, seed=3):
        value = s.question.split("assigned the value ")[1].split(" ")[0]
        assert s.document.count(value) == 1
        assert f"VAR {s.answers[0]} = {value}." in s.document
        for a, b in zip(s.answers, s.answers[1:]):
            assert s.document.index(f"VAR {b} = VAR {a}.") > s.document.index(f"VAR {a} = ")
        for name in s.answers:
            assert s.document.count(f"VAR {name} =") == 1
        assert len(s.answers) == T.HOPS + 1
        assert s.document.count("VAR ") == 2 * len(s.answers) + 2 * T.HOPS  # plus one distractor chain


def test_deterministic_and_distinct(tok):
    a = T.generate("niah_multiquery", 1024, 3, tok, seed=5)
    assert a == T.generate("niah_multiquery", 1024, 3, tok, seed=5)
    assert a != T.generate("niah_multiquery", 1024, 3, tok, seed=6)
    needles = [frozenset(line for line in s.document.split("\n") if "special magic" in line and " is: " in line) for s in a]
    assert len(set(needles)) == len(needles)


def test_depths_spread(tok):
    want = T.first_depths("niah_single", 8, 0)
    assert all(b - a == pytest.approx(1 / 8) for a, b in zip(want, want[1:])) and 0 <= want[0] < 1 / 8
    for s, d in zip(T.generate("niah_single", 2048, 8, tok), want):
        lines = s.document.split("afterwards.\n\n", 1)[1].split("\n")
        at = next(i for i, line in enumerate(lines) if s.answers[0] in line)
        assert abs(at / len(lines) - d) < 0.1  # snapped to the nearest paragraph boundary


def test_answer_target_and_score(tok):
    single, multi = T.generate("niah_single", 1024, 1, tok)[0], T.generate("niah_multivalue", 1024, 1, tok)[0]
    assert T.answer_target(single) == f" {single.answers[0]}."
    a, b, c, d = multi.answers
    assert T.answer_target(multi) == f" {a}, {b}, {c} and {d}."
    assert T.score_text(multi, T.answer_target(multi)) == 1.0
    assert T.score_text(multi, f"{a} and {c}") == 0.5
    assert T.score_text(single, "no idea") == 0.0
    vt = T.generate("vt", 1024, 1, tok)[0]
    assert T.score_text(vt, T.answer_target(vt).lower()) == 1.0  # case-insensitive, as RULER


def fed(tok, s: T.Sample) -> int:
    """Tokens a runner feeds: document, question and answer, each tokenized alone."""
    return sum(len(tok(t, add_special_tokens=False).input_ids) for t in (s.document, s.question, T.answer_target(s)))


@pytest.mark.parametrize("task", ["niah_single", "niah_multivalue"])
def test_limit_keeps_the_answer_within_the_model(tok, task):
    """With ``limit`` (the model's positions) a prompt whose answer would run past it is refitted
    shorter; every other sample is exactly the one generated without a limit."""
    free = T.generate(task, 1024, 6, tok, seed=2)
    held = T.generate(task, 1024, 6, tok, seed=2, limit=1024)
    assert all(fed(tok, s) <= 1024 for s in held)
    assert any(fed(tok, s) > 1024 for s in free) == (task == "niah_multivalue")  # 4 values: ~30 answer tokens
    for a, b in zip(free, held):
        assert (a == b) == (fed(tok, a) <= 1024)
        assert b.answers == a.answers and n_tokens(tok, b) >= 1024 - 2 * T.MARGIN


def test_errors(tok):
    with pytest.raises(ValueError, match="unknown task"):
        T.generate("niah_double", 1024, 1, tok)
    with pytest.raises(ValueError, match="does not fit"):
        T.generate("niah_single", 10**6, 1, tok)
    with pytest.raises(ValueError, match="unknown haystack"):
        T.generate("niah_single", 1024, 1, tok, haystack="wiki")


def test_haystack_sources(tok):
    """Development samples fill with the calibration text, measurements with the eval text."""
    from oscarkv.data import read_text

    dev, ev = (T.generate("niah_single", 1024, 1, tok, seed=3, haystack=h)[0] for h in ("calibration", "eval"))
    body = lambda s: [ln for ln in s.document.split("\n") if len(ln) > 40 and "magic" not in ln][2:6]  # noqa: E731
    assert all(ln in read_text("calibration.txt") and ln not in read_text("eval.txt") for ln in body(dev))
    assert all(ln in read_text("eval.txt") for ln in body(ev))


def test_gazetteer_haystack(tok):
    """The second evaluation haystack is prose from its own file, and samples know their haystack."""
    from oscarkv.data import read_text

    s = T.generate("niah_single", 1024, 2, tok, seed=3, haystack="gazetteer")[1]
    body = [ln for ln in s.document.split("\n") if len(ln) > 40 and "magic" not in ln][2:6]
    assert s.haystack == "gazetteer" and all(ln in read_text("gazetteer.txt") for ln in body)
    assert s.answers[0] in s.document and not any(c.isdigit() for c in read_text("gazetteer.txt"))


def test_needle_place(tok):
    """A needle counts as in the BF16 window only when it lies in the last ``recent`` prompt tokens."""
    from oscarkv.config import KVConfig
    from oscarkv.eval.samples import needle_place

    samples = T.generate("niah_single", 1024, 8, tok, seed=5)
    places = [needle_place(tok, s, KVConfig(sink=4, recent=128)) for s in samples]
    assert places[0] == "history" and "window" in places  # depths spread over [0, 1)
    assert all(needle_place(tok, s, KVConfig(sink=0, recent=0)) == "history" for s in samples)
    assert all(needle_place(tok, s, KVConfig(sink=0, recent=1024)) == "window" for s in samples)


def test_text_windows(tok):
    w = text_windows(tok, 512, 4, seed=0)
    assert [x.shape for x in w] == [(512,)] * 4
    assert all(torch_equal(x, y) for x, y in zip(w, text_windows(tok, 512, 4, seed=0)))
    starts = [find(tok, x) for x in w]
    assert all(b - a >= 512 for a, b in zip(starts, starts[1:]))  # non-overlapping, in order
    with pytest.raises(ValueError, match="windows"):
        text_windows(tok, 4096, max_windows(tok, 4096) + 1)


def torch_equal(x, y) -> bool:
    return bool((x == y).all())


def find(tok, window) -> int:
    """Token offset of ``window`` in eval.txt (first 16 tokens matched)."""
    from oscarkv.eval.perplexity_data import _token_ids

    hits = (_token_ids(tok).unfold(0, 16, 1) == window[:16]).all(1).nonzero()
    return int(hits[0, 0])
