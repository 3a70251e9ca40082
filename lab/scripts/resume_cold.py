"""What ``EngineConfig.resume_questions`` costs a cold prompt (issue 29): the flag starts one more chunk at a long
prompt's last line, so a prompt nothing is cached for runs one more step. Per context and KV method, one served
engine (random weights at a real shape, prefix caching, 512-token chunks, piecewise graphs; the default model's
tokenizer, ``--tokenizer DIR``) serves a chat whose one message holds the document and a question, each run's
document new (a line of its own first: nothing cached), the flag off and on in turn (``--runs`` each, after one
untimed pair): time to the first token, steps run and tokens computed. Prints a table, writes ``resume_cold.json``.

    python -m lab.scripts.resume_cold --tokenizer DIR --contexts 32768,102400 --methods bf16,oscar --out DIR
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace

from lab.scripts.chat_followup import QUESTION, document, follow_engine, grid, turn
from oscarkv.engine.admission import LineStarts


def one(model, tok, method: str, context: int, runs: int, kind: str = "questions", kv_bytes: int = 24 << 30) -> list[dict]:
    engine = follow_engine(model, tok, method, kind, kv_bytes)
    doc, lines, rows = document(tok, context), LineStarts.of(tok), []
    for i in range(runs + 1):
        for on in (False, True):
            engine.admission = replace(engine.admission, lines=lines if on else None)
            text = tok.apply_chat_template([{"role": "user", "content": f"Copy {i} {on}.\n{doc}\n{QUESTION}"}],
                                           tokenize=False, add_generation_prompt=True)
            n = len(engine.runner.launches)
            r = turn(engine, text, f"c{i}{on}")
            r |= dict(method=method, context=context, resume=on, run=i, steps=len(engine.runner.launches) - n)
            if i:  # NOTE: run 0 warms both paths
                rows.append(r)
            print(json.dumps(r), flush=True)
    engine.close()
    return rows


def table(rows: list[dict]) -> str:
    out = ["| context | kv | steps off / on | computed off / on | first token off ms | first token on ms | on / off |",
           "|---:|---|---|---|---:|---:|---:|"]
    for c, m in dict.fromkeys((r["context"], r["method"]) for r in rows):
        sel = {on: [r for r in rows if (r["context"], r["method"], r["resume"]) == (c, m, on)] for on in (False, True)}
        med = {on: 1e3 * statistics.median(r["first_token_s"] for r in sel[on]) for on in sel}
        out.append(f"| {c} | {m} | {sel[False][0]['steps']} / {sel[True][0]['steps']} | {sel[False][0]['computed']} / "
                   f"{sel[True][0]['computed']} | {med[False]:.1f} | {med[True]:.1f} | {med[True] / med[False]:.3f} |")
    return "\n".join(out)


if __name__ == "__main__":
    grid(one, table, "resume_cold")
