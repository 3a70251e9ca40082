"""Does ``EngineConfig.resume_questions`` change answers? (CPU, development data, default model, as served.)

The flag starts a chunk at a long prompt's last line, so the question reads the document tokens before it beyond
the recent window in INT2 where, in one chunk with them, it read them in BF16. Here the same single-needle samples
(the ``calibration`` haystack: development data, never the evaluation text) run through ``LLM`` with the shipped
recipe, the flag off and on: answers scored with RULER's string match, and how many generated texts are equal.
Writes ``resume_questions_ab.json``.

    OMP_NUM_THREADS=2 python -m lab.scripts.resume_questions_ab --contexts 4096 --samples 40 --out DIR
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from oscarkv.engine.admission import LineStarts
from oscarkv.engine.request import SamplingParams
from oscarkv.eval import tasks as task_lib
from oscarkv.eval.engine_backend import answer_budget
from oscarkv.llm import LLM


def answers(llm: LLM, samples: list, resume: bool) -> list[str]:
    tok = llm.loaded.tokenizer
    eng = llm.engine
    eng.admission = replace(eng.admission, lines=LineStarts.of(tok) if resume else None)
    out = []
    for s in samples:
        ids = tok(s.document, add_special_tokens=False).input_ids + tok(s.question, add_special_tokens=False).input_ids
        n = len(tok(task_lib.answer_target(s), add_special_tokens=False).input_ids)
        params = SamplingParams(max_tokens=answer_budget(n, len(ids), eng.max_model_len), temperature=0)
        split = bool(eng.admission.question(eng.admission.held.int32(tuple(ids))))
        out.append((llm.generate([ids], params)[0].text, split))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="4096")
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--task", default="niah_single")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    llm, rows = LLM(), []
    tok = llm.loaded.tokenizer
    for context in map(int, a.contexts.split(",")):
        samples = task_lib.generate(a.task, context, a.samples, tok, seed=11, haystack="calibration")
        off, on = answers(llm, samples, False), answers(llm, samples, True)
        score = lambda res: sum(task_lib.score_text(s, t) for s, (t, _) in zip(samples, res)) / len(samples)  # noqa: E731
        row = dict(context=context, task=a.task, samples=len(samples), score_off=score(off), score_on=score(on),
                   split=sum(sp for _, sp in on), same_text=sum(x[0] == y[0] for x, y in zip(off, on)))
        print(json.dumps(row), flush=True)
        rows.append(row)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "resume_questions_ab.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
