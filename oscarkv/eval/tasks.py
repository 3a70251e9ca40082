"""RULER-style synthetic long-context tasks, generated offline and deterministically from a seed.

Each :class:`Sample` is a chat prompt split in two: ``document`` (system prompt, start of the
user turn, instruction and the haystack with its needles) is what the runner prefills and
stores in the KV cache under test; ``question`` (the question, end of the user turn, start of
the assistant turn and an answer prefix) is run next against the cache as stored.
:func:`answer_target` is the continuation the model should produce; :func:`score_text` is
RULER's string-match metric. The runner (``oscarkv.eval.runner``) consumes all three.

Haystack: consecutive lines of one text (``HAYSTACKS``) from a seed-dependent paragraph:
``eval.txt`` (Shakespeare, verse drama) or ``gazetteer.txt`` (generated expository prose) for
measurements, both from sources other than the calibration text; for development studies that
must not touch evaluation samples, ``calibration.txt`` (``haystack="calibration"``). It is
filled until ``document + question`` is within ``MARGIN`` tokens below ``context``. Needles are paragraphs of their own at paragraph
boundaries; the first needle's depth is spread evenly over ``[0, 1)`` across the samples of
one call, the others sit at evenly spaced depths after it.

Tasks (after RULER, Hsieh et al. 2024):

* ``niah_single`` — one needle "One of the special magic numbers for {key} is: {value}.".
* ``niah_multikey`` — the real needle and 3 distractor needles with other keys and values.
* ``niah_multivalue`` — 4 values for one key; answers in document order.
* ``niah_multiquery`` — 4 keys, all asked; answers in the order asked.
* ``vt`` — variable tracking: a chain ``VAR A = 12345.``, ``VAR B = VAR A.`` … of 4 hops and
  one distractor chain with another value; answers are the 5 names of the chain, in order.

NOTE: invariants (checked in ``tests/eval/test_tasks.py``): every needle lies in ``document``
and every NIAH answer occurs there exactly once, as does every ``VAR name =`` and the chain
value; distractor values differ from gold ones; keys/names/values never occur in the
haystack text; the same arguments give identical samples.
"""

from __future__ import annotations

import bisect
import functools
import random
from dataclasses import dataclass, replace

from oscarkv.config import TASKS
from oscarkv.data import read_text

__all__ = ["TASKS", "MARGIN", "Sample", "generate", "first_depths", "answer_target", "score_text"]

MARGIN = 64
"""A prompt holds at most ``context`` and at least ``context - MARGIN`` tokens."""
HOPS = 4
"""Assignments after the first in a ``vt`` chain (so a chain names ``HOPS + 1`` variables)."""

NEEDLE = "One of the special magic numbers for {key} is: {value}."
NIAH_INSTRUCTION = ("Some special magic numbers are hidden within the following text. "
                    "Make sure to memorize it. I will quiz you about the numbers afterwards.")
VT_INSTRUCTION = "Memorize and track the chain(s) of variable assignment hidden in the following text."

ADJECTIVES = ("amber", "ancient", "bitter", "brave", "bright", "calm", "clever", "crimson", "curious",
              "distant", "eager", "fierce", "gentle", "golden", "hollow", "humble", "icy", "jolly",
              "lively", "lonely", "lucky", "mellow", "misty", "nimble", "noble", "olive", "pale",
              "quiet", "rapid", "rustic", "scarlet", "silent", "silver", "sleepy", "solemn", "steady",
              "swift", "tender", "tidy", "velvet", "vivid", "wandering", "wise", "witty", "young", "zesty")
NOUNS = ("anchor", "badger", "beacon", "bison", "canyon", "cedar", "comet", "compass", "crystal",
         "dolphin", "ember", "falcon", "fern", "glacier", "harbor", "heron", "island", "jackal",
         "kettle", "lantern", "lizard", "magnet", "meadow", "nectar", "orchid", "otter", "parrot",
         "pebble", "pepper", "quartz", "raven", "river", "saddle", "salmon", "spruce", "thistle",
         "tiger", "tulip", "valley", "violin", "walnut", "willow", "yak", "zebra", "zenith", "puffin")


@dataclass(frozen=True)
class Sample:
    """One prompt of a synthetic task; ``document + question`` is the full chat prompt."""

    task: str
    """One of ``TASKS``."""
    context: int
    """Target prompt length in tokens (document + question), met within ``MARGIN`` below."""
    seed: int
    """Seed of the ``generate`` call that made it."""
    document: str
    """Chat-formatted prefix up to and including the haystack: prefilled and cached."""
    question: str
    """Appended right after ``document``: question, end of user turn, assistant start, answer prefix."""
    answers: tuple[str, ...]
    """Gold answers in the order the answer prefix expects them."""
    haystack: str = "eval"
    """Name of the filler text (``HAYSTACKS``)."""


@dataclass(frozen=True)
class _Spec:
    """What a task hides in the haystack and what it asks."""

    instruction: str
    needles: tuple[str, ...]
    depths: tuple[float, ...]  # one per needle, in [0, 1)
    question: str
    prefix: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class _Corpus:
    """A haystack text as lines with their token counts, tokenized once per tokenizer."""

    text: str
    lines: tuple[str, ...]  # each keeps its "\n"; a blank line is "\n"
    cum: tuple[int, ...]  # cum[i] = tokens in lines[:i] (lines tokenize almost additively)
    starts: tuple[int, ...]  # indexes of lines that begin a paragraph


HAYSTACKS = {"eval": "eval.txt", "gazetteer": "gazetteer.txt", "calibration": "calibration.txt"}
"""Haystack sources: ``eval`` (verse drama) and ``gazetteer`` (expository prose) for
measurements, ``calibration`` (the calibration text) for development studies."""


@functools.lru_cache(maxsize=4)
def _corpus(tokenizer, haystack: str = "eval") -> _Corpus:
    text = read_text(HAYSTACKS[haystack])
    lines = tuple(text.splitlines(keepends=True))
    counts = [len(ids) for ids in tokenizer(list(lines), add_special_tokens=False).input_ids]
    cum = [0]
    for c in counts:
        cum.append(cum[-1] + c)
    starts = tuple(i for i in range(len(lines)) if lines[i] != "\n" and (i == 0 or lines[i - 1] == "\n"))
    return _Corpus(text, lines, tuple(cum), starts)


# ------------------------------------------------------------------------------- drawing
def _draw(rng: random.Random, k: int, make, text: str) -> list[str]:
    """``k`` distinct strings from ``make(rng)``, none in ``text`` nor a substring of another."""
    out: list[str] = []
    while len(out) < k:
        s = make(rng)
        if s not in text and all(s not in o and o not in s for o in out):
            out.append(s)
    return out


def _keys(rng: random.Random, k: int, text: str) -> list[str]:
    return _draw(rng, k, lambda r: f"{r.choice(ADJECTIVES)}-{r.choice(NOUNS)}", text)


def _numbers(rng: random.Random, k: int, digits: int, text: str) -> list[str]:
    return _draw(rng, k, lambda r: str(r.randrange(10 ** (digits - 1), 10**digits)), text)


def _names(rng: random.Random, k: int, text: str) -> list[str]:
    return _draw(rng, k, lambda r: "".join(r.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)), text)


def _spread(depth: float, k: int) -> list[float]:
    """``k`` depths evenly spaced around the unit circle, starting at ``depth``."""
    return [(depth + j / k) % 1.0 for j in range(k)]


def _join(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# ------------------------------------------------------------------------------- tasks
def _niah_single(rng: random.Random, depth: float, text: str) -> _Spec:
    (key,), (value,) = _keys(rng, 1, text), _numbers(rng, 1, 7, text)
    return _Spec(NIAH_INSTRUCTION, (NEEDLE.format(key=key, value=value),), (depth,),
                 f"What is the special magic number for {key} mentioned in the provided text?",
                 f"The special magic number for {key} mentioned in the provided text is", (value,))


def _niah_multikey(rng: random.Random, depth: float, text: str) -> _Spec:
    keys, values = _keys(rng, 4, text), _numbers(rng, 4, 7, text)  # keys[0] is the real one
    needles = tuple(NEEDLE.format(key=k, value=v) for k, v in zip(keys, values))
    return _Spec(NIAH_INSTRUCTION, needles, tuple(_spread(depth, 4)),
                 f"What is the special magic number for {keys[0]} mentioned in the provided text?",
                 f"The special magic number for {keys[0]} mentioned in the provided text is", (values[0],))


def _niah_multivalue(rng: random.Random, depth: float, text: str) -> _Spec:
    (key,), values = _keys(rng, 1, text), _numbers(rng, 4, 7, text)
    # NOTE: depths sorted and needles in that order, so answers are in document order.
    return _Spec(NIAH_INSTRUCTION, tuple(NEEDLE.format(key=key, value=v) for v in values),
                 tuple(sorted(_spread(depth, 4))),
                 f"What are all the special magic numbers for {key} mentioned in the provided text?",
                 f"The special magic numbers for {key} mentioned in the provided text are", tuple(values))


def _niah_multiquery(rng: random.Random, depth: float, text: str) -> _Spec:
    keys, values = _keys(rng, 4, text), _numbers(rng, 4, 7, text)
    asked = rng.sample(range(4), 4)
    query = _join(keys[i] for i in asked)
    return _Spec(NIAH_INSTRUCTION, tuple(NEEDLE.format(key=k, value=v) for k, v in zip(keys, values)),
                 tuple(_spread(depth, 4)),
                 f"What are all the special magic numbers for {query} mentioned in the provided text?",
                 f"The special magic numbers for {query} mentioned in the provided text are",
                 tuple(values[i] for i in asked))


def _chain(names: list[str], value: str) -> list[str]:
    return [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:])]


def _vt(rng: random.Random, depth: float, text: str) -> _Spec:
    names = _names(rng, 2 * (HOPS + 1), text)
    gold, decoy = names[: HOPS + 1], names[HOPS + 1:]
    value, other = _numbers(rng, 2, 5, text)
    # NOTE: each chain's depths are sorted so every assignment follows the one it reads.
    depths = sorted(_spread(depth, HOPS + 1)) + sorted(_spread(depth + 0.5 / (HOPS + 1), HOPS + 1))
    return _Spec(VT_INSTRUCTION, tuple(_chain(gold, value) + _chain(decoy, other)), tuple(depths),
                 f"Question: Find all variables that are assigned the value {value} in the text above.",
                 "Answer: According to the chain(s) of variable assignment in the text above, "
                 f"{len(gold)} variables are assigned the value {value}, they are:", tuple(gold))


_BUILDERS = {"niah_single": _niah_single, "niah_multikey": _niah_multikey,
             "niah_multivalue": _niah_multivalue, "niah_multiquery": _niah_multiquery, "vt": _vt}
assert tuple(_BUILDERS) == TASKS


# ------------------------------------------------------------------------------- layout
def _haystack(corpus: _Corpus, start: int, stop: int, spec: _Spec) -> str:
    """Lines ``[start, stop)`` with each needle as its own paragraph at its depth."""
    body = corpus.lines[start:stop]
    bounds = [0] + [j for j in range(1, len(body) + 1) if body[j - 1] == "\n"]
    slots = sorted((_nearest(bounds, d * len(body)), i) for i, d in enumerate(spec.depths))
    out: list[str] = []
    prev = 0
    for pos, i in slots:
        out += body[prev:pos]
        out.append(spec.needles[i] + "\n\n")
        prev = pos
    out += body[prev:]
    return "".join(out).strip()


def _nearest(bounds: list[int], x: float) -> int:
    i = bisect.bisect_left(bounds, x)
    return min(bounds[max(i - 1, 0): i + 1], key=lambda b: abs(b - x))


def _render(tokenizer, spec: _Spec, haystack: str) -> tuple[str, str]:
    """(document, question): the chat template's own text, cut right after the haystack."""
    user = f"{spec.instruction}\n\n{haystack}\n\n{spec.question}"
    full = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                         add_generation_prompt=True)
    cut = full.index(haystack) + len(haystack)
    return full[:cut], full[cut:] + spec.prefix


def _count(tokenizer, document: str, question: str) -> int:
    return len(tokenizer(document + question, add_special_tokens=False).input_ids)


def _take(corpus: _Corpus, start: int, tokens: int) -> int:
    """Largest ``stop`` with lines ``[start, stop)`` holding at most ``tokens`` tokens."""
    return max(start, bisect.bisect_right(corpus.cum, corpus.cum[start] + tokens) - 1)


def _fit(tokenizer, corpus: _Corpus, spec: _Spec, context: int, rng: random.Random) -> tuple[str, str]:
    """Fill the haystack until the prompt is in ``[context - MARGIN, context]`` tokens."""
    fixed = _count(tokenizer, *_render(tokenizer, spec, "\n\n".join(spec.needles)))
    budget = context - MARGIN // 2 - fixed
    room = [s for s in corpus.starts if corpus.cum[-1] - corpus.cum[s] >= budget + MARGIN]
    if budget < MARGIN or not room:
        raise ValueError(f"context {context} does not fit: the task text takes {fixed} tokens and "
                         f"the haystack text holds {corpus.cum[-1]}")
    start = rng.choice(room)
    stop = _take(corpus, start, budget)
    for _ in range(8):  # line counts are almost additive: one or two corrections at most
        doc, question = _render(tokenizer, spec, _haystack(corpus, start, stop, spec))
        n = _count(tokenizer, doc, question)
        if context - MARGIN <= n <= context:
            return doc, question
        stop = _take(corpus, start, corpus.cum[stop] - corpus.cum[start] + context - MARGIN // 2 - n)
    raise RuntimeError(f"could not fit a {spec.needles[0]!r} prompt into {context} tokens")


# ------------------------------------------------------------------------------- public
def generate(task: str, context: int, n: int, tokenizer, seed: int = 0, haystack: str = "eval",
             limit: int | None = None) -> list[Sample]:
    """``n`` samples of ``task`` whose prompts have ``context - MARGIN``..``context`` tokens.

    Sample ``i`` draws from its own RNG (task, context, seed, i); its first needle sits at depth
    ``first_depths(task, n, seed)[i]``, so depths cover ``[0, 1)`` evenly. ``haystack`` names
    the filler text (``HAYSTACKS``). ``limit`` (the model's positions) bounds prompt *plus*
    :func:`answer_target`: a sample whose answer would run past it is refitted shorter (only
    those samples change; at 8K the 4-value answers of ``niah_multivalue``/``multiquery`` can)."""
    if haystack not in HAYSTACKS:
        raise ValueError(f"unknown haystack {haystack!r}; choose from {tuple(HAYSTACKS)}")
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {TASKS}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    corpus = _corpus(tokenizer, haystack)
    return [replace(_sample(task, context, seed, i, d, tokenizer, corpus, limit), haystack=haystack)
            for i, d in enumerate(first_depths(task, n, seed))]


def first_depths(task: str, n: int, seed: int = 0) -> list[float]:
    """Intended depth (fraction of the haystack's lines) of each sample's first needle.

    NOTE: the needle lands on the paragraph boundary nearest to it, so the realised depth
    can differ by up to half a speech."""
    phase = random.Random(f"{task}/{seed}").random()
    return [(i + phase) / n for i in range(n)]


def _sample(task: str, context: int, seed: int, i: int, depth: float, tokenizer, corpus: _Corpus,
            limit: int | None) -> Sample:
    rng = random.Random(f"{task}/{context}/{seed}/{i}")
    spec = _BUILDERS[task](rng, depth, corpus.text)
    document, question = _fit(tokenizer, corpus, spec, context, rng)
    if limit is not None:
        document, question = _within(tokenizer, corpus, spec, document, question, limit,
                                     random.Random(f"{task}/{context}/{seed}/{i}/limit"))
    return Sample(task, context, seed, document, question, spec.answers)


def _within(tokenizer, corpus: _Corpus, spec: _Spec, document: str, question: str, limit: int,
            rng: random.Random) -> tuple[str, str]:
    """Refit the prompt shorter while prompt + answer (as the runners feed them) exceed ``limit``."""
    for _ in range(4):  # the answer's length does not depend on the haystack: one refit, rarely two
        over = _fed(tokenizer, document, question, _target(spec.answers)) - limit
        if over <= 0:
            return document, question
        document, question = _fit(tokenizer, corpus, spec, _count(tokenizer, document, question) - over, rng)
    raise RuntimeError(f"could not fit a {spec.needles[0]!r} prompt and its answer into {limit} tokens")


def answer_target(sample: Sample) -> str:
    """The continuation expected right after the answer prefix.

    One answer: ``" 1234567."``; several: ``" a, b, c and d."`` (no Oxford comma), in the
    order of ``sample.answers``."""
    return _target(sample.answers)


def _target(answers: tuple[str, ...]) -> str:
    return f" {_join(answers)}."


def _fed(tokenizer, document: str, question: str, target: str) -> int:
    """Tokens the runners feed for a sample: document, question and answer, each tokenized alone."""
    return sum(len(tokenizer(t, add_special_tokens=False).input_ids) for t in (document, question, target))


def score_text(sample: Sample, generated: str) -> float:
    """Fraction of gold answers contained in ``generated`` (RULER's case-insensitive string match)."""
    text = generated.lower()
    return sum(a.lower() in text for a in sample.answers) / len(sample.answers)
