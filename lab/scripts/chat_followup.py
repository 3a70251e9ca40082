"""Chat follow-ups on a cached document as ``LLM`` and ``serve`` users send them: the whole conversation as text,
every turn (issue 29). Per context and KV method, one engine (random weights at a real shape, prefix caching,
512-token chunks, as served) with the default model's tokenizer (``--tokenizer DIR``: its ``save_pretrained``;
ids fit any larger vocabulary) serves the document question once (cached), one untimed turn pair, then
``--turns`` new turns with :class:`~oscarkv.engine.token_memo.TokenMemo` on and off in turn: each request's
time from ``add_request(text)`` to its first token (tokenizing, validation, the step), and the tokenizer alone
on the same text (whole against the memo, ids checked equal). ``--kind questions``: each follow-up a new
conversation whose one message holds the document and another question (the memo cuts at a line start);
``questions+resume``: with ``EngineConfig.resume_questions`` (a chunk starts at the question's line). Prints a table,
writes ``chat_followup.json``.

    python -m lab.scripts.chat_followup --tokenizer DIR --contexts 32768,102400 --methods bf16,oscar --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path

from oscarkv.bench import e2e
from oscarkv.bench.followup import followup_engine
from oscarkv.config.serving import PIECEWISE_BUCKETS
from oscarkv.engine.admission import LineStarts
from oscarkv.engine.request import SamplingParams
from oscarkv.engine.token_memo import TokenMemo

QUESTION = "Which harbour lies east of the town, and what does the entry say about it?"


def document(tok, tokens: int) -> str:
    text = resources.files("oscarkv.data").joinpath("gazetteer.txt").read_text()
    per_char = len(tok(text[:20000]).input_ids) / 20000
    reps = int(tokens / per_char / len(text)) + 1
    return (text * reps)[:int(tokens / per_char)]


def asked(msgs: list[dict], kind: str, i: int, memo: bool) -> list[dict]:
    """Follow-up ``i``'s messages: the conversation grown by an answer and a question (``turns``), or a new one asking
    another question about the document in its one message (``questions``)."""
    q = f"Question {i} ({memo}): and what lies west of the harbour?"
    if kind.startswith("questions"):
        return [{"role": "user", "content": msgs[0]["content"][:-len(QUESTION)] + q}]
    return msgs + [{"role": "assistant", "content": f"Answer {i}{memo}: it lies east, by the pier."},
                   {"role": "user", "content": q}]


def follow_engine(model, tok, method: str, kind: str, kv_bytes: int):
    """The served engine of these follow-ups (512-token chunks, piecewise graphs); ``EngineConfig.resume_questions``
    (on by default since 2026-11-29) only for ``questions+resume``, so the other kinds measure what they did."""
    engine = followup_engine(model, method, kv_bytes, 512, 512, PIECEWISE_BUCKETS, tokenizer=tok)
    engine.admission = replace(engine.admission, lines=LineStarts.of(tok) if kind.endswith("+resume") else None)
    return engine


def turn(engine, text: str, rid: str) -> dict:
    hits, n = engine.manager.hit_tokens, len(engine.runner.launches)
    e2e.sync()
    t = time.perf_counter()
    engine.add_request(rid, text, SamplingParams(max_tokens=1, ignore_eos=True))
    admit = time.perf_counter() - t
    while engine.has_unfinished():
        engine.step()
    e2e.sync()
    return dict(first_token_s=time.perf_counter() - t, admit_s=admit, hit=engine.manager.hit_tokens - hits,
                computed=sum(x.tokens for x in engine.runner.launches[n:]))


def tokenize_times(tok, held: str, text: str) -> dict:
    memo = TokenMemo(tok)
    memo.encode(held, add_special_tokens=False)
    t = time.perf_counter()
    got = memo.encode(text, add_special_tokens=False)
    cut = time.perf_counter() - t
    t = time.perf_counter()
    want = tok(text, add_special_tokens=False).input_ids
    whole = time.perf_counter() - t
    assert got == want, "TokenMemo gave other ids than the tokenizer"
    return dict(tokens=len(want), memo_s=cut, whole_s=whole)


def one(model, tok, method: str, context: int, turns: int, kind: str = "turns", kv_bytes: int = 24 << 30) -> list[dict]:
    engine = follow_engine(model, tok, method, kind, kv_bytes)
    msgs = [{"role": "user", "content": document(tok, context) + "\n" + QUESTION}]
    chat = lambda m: tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)  # noqa: E731
    base = chat(msgs)
    turn(engine, base, "doc")
    rows = []
    for i in range(turns + 1):
        for memo in (True, False):
            engine.tokens.enabled = memo
            text = chat(asked(msgs, kind, i, memo))
            r = turn(engine, text, f"t{i}{memo}") | dict(method=method, context=context, memo=memo, turn=i, kind=kind)
            r |= tokenize_times(tok, base, text)
            if i:  # NOTE: turn 0 is the warm-up (its staged graph captured on the second sighting)
                rows.append(r)
            print(json.dumps(r), flush=True)
    engine.close()
    return rows


def table(rows: list[dict]) -> str:
    out = ["| context | kv | prompt tokens | computed | first token, memo ms | first token, whole ms | "
           "tokenize memo ms | tokenize whole ms |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    keys = dict.fromkeys((r["context"], r["method"]) for r in rows)
    for c, m in keys:
        sel = [r for r in rows if (r["context"], r["method"]) == (c, m)]
        med = lambda k, memo: 1e3 * statistics.median(r[k] for r in sel if r["memo"] == memo)  # noqa: E731
        out.append(f"| {c} | {m} | {sel[0]['tokens']} | {sel[0]['computed']} | {med('first_token_s', True):.1f} | "
                   f"{med('first_token_s', False):.1f} | {med('memo_s', True):.2f} | {med('whole_s', True):.1f} |")
    return "\n".join(out)


def grid(one_fn, table_fn, name: str) -> None:
    """The command line of this script and ``lab.scripts.served_chat``: ``one_fn`` per context and method, rows to
    ``NAME.json`` under ``--out``, then ``table_fn``'s table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--shape", default="qwen3-4b")
    ap.add_argument("--contexts", default="32768,102400")
    ap.add_argument("--methods", default="bf16,oscar")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--kind", choices=("turns", "questions", "questions+resume"), default="turns")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    model, rows = e2e.random_model(a.shape), []
    for context in (int(c) for c in a.contexts.split(",")):
        for method in a.methods.split(","):
            rows += one_fn(model, tok, method, context, a.turns, a.kind)
            e2e.release()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    print(table_fn(rows))


if __name__ == "__main__":
    grid(one, table, "chat_followup")
