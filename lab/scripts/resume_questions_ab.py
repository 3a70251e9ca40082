"""Does ``EngineConfig.resume_questions`` change answers? (development data, default model, as served.)

The flag starts a chunk at a long prompt's last line — in a served chat, the question's — so the question reads the
document tokens before it beyond the recent window as stored (INT2) where, in one chunk with them, it read them in
BF16. The eval's prompts end with an answer prefix after the assistant's turn marker, so the flag's own rule would
split there; this script splits where a chat that ends at the marker would: ``Admission.question`` of the prompt up
to its last marker, passed as the request's resume point. The same single-needle samples (the ``calibration``
haystack: development data, never the evaluation text) run through the engine of ``LLM`` with the shipped recipe,
the split off and on: answers scored with RULER's string match, generated texts compared, and the same for the
samples whose needle lies in the document's last ``prefill_chunk`` tokens (``near``: those whose question, split
off, reads the needle as stored instead of in BF16). ``--no-prefix-caching``: every request cold (the split made
all the same), against the served engine's hits. Writes ``resume_questions_ab.json``.

    OMP_NUM_THREADS=2 python -m lab.scripts.resume_questions_ab --contexts 4096 --samples 40 --out DIR
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from oscarkv.engine.admission import Admission, LineStarts, turn_ends, turn_marker
from oscarkv.engine.request import SamplingParams
from oscarkv.eval import tasks as task_lib
from oscarkv.eval.engine_backend import answer_budget
from oscarkv.llm import LLM


def split_at(adm: Admission, ids: list[int]) -> tuple[int, ...]:
    """Where a served chat's question line starts (``Admission.question`` of the prompt up to its last turn
    marker; ``adm`` with line starts), or ``()``."""
    ends = turn_ends(ids, adm.turn_marker)
    return adm.question(np.asarray(ids[:ends[-1]], dtype=np.int32)) if ends else ()


def answer(eng, rid: str, ids: list[int], params: SamplingParams, resume: tuple[int, ...]) -> str:
    eng.add_request(rid, ids, params, resume=resume)
    text = ""
    while eng.has_unfinished():
        for o in eng.step():
            text = o.text if o.request_id == rid else text
    return text


def run(llm: LLM, samples: list) -> list[dict]:
    tok, eng = llm.loaded.tokenizer, llm.engine
    adm = replace(eng.admission, lines=LineStarts.of(tok), turn_marker=turn_marker(tok))
    rows = []
    for i, s in enumerate(samples):
        doc = tok(s.document, add_special_tokens=False).input_ids
        ids = doc + tok(s.question, add_special_tokens=False).input_ids
        n = len(tok(task_lib.answer_target(s), add_special_tokens=False).input_ids)
        params = SamplingParams(max_tokens=answer_budget(n, len(ids), eng.max_model_len), temperature=0)
        tail = tok.decode(doc[-eng.cfg.prefill_chunk:])
        at = split_at(adm, ids)
        texts = [answer(eng, f"{i}-{on}", ids, params, at if on else ()) for on in (False, True)]
        rows.append(dict(split=bool(at), near=any(a in tail for a in s.answers), same=texts[0] == texts[1],
                         off=task_lib.score_text(s, texts[0]), on=task_lib.score_text(s, texts[1])))
    return rows


def summary(rows: list[dict]) -> dict:
    n = max(len(rows), 1)
    return dict(samples=len(rows), split=sum(r["split"] for r in rows), same_text=sum(r["same"] for r in rows),
                score_off=sum(r["off"] for r in rows) / n, score_on=sum(r["on"] for r in rows) / n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--contexts", default="4096")
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--tasks", default="niah_single")
    ap.add_argument("--no-prefix-caching", action="store_true", help="every request cold (the split still made)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    llm, out = LLM(a.model), []
    if a.no_prefix_caching:  # NOTE: the served config (the artifact's recipe) without caching, on a model of its own
        cfg = replace(llm.engine.cfg, enable_prefix_caching=False)
        llm.close()
        llm = LLM(a.model, config=cfg)
    for task in a.tasks.split(","):
        for context in map(int, a.contexts.split(",")):
            samples = task_lib.generate(task, context, a.samples, llm.loaded.tokenizer, seed=11, haystack="calibration")
            rows = run(llm, samples)
            row = dict(context=context, task=task, caching=not a.no_prefix_caching, **summary(rows), near=summary([r for r in rows if r["near"]]))
            print(json.dumps(row), flush=True)
            out.append(row)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "resume_questions_ab.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
