"""Chat follow-ups on a cached document through the server, as a client of ``serve`` sees them (issue 29): the
official ``openai`` client over loopback, the whole conversation sent every turn. Per context and KV method, one
engine (random weights at a real shape, prefix caching, 512-token chunks) with the default model's tokenizer
(``--tokenizer DIR``, its ``save_pretrained``) behind ``create_app``; the document question is cached first (filled
as the benches fill), then one untimed turn pair and ``--turns`` new turns with
:class:`~oscarkv.engine.token_memo.TokenMemo` on and off in turn: wall time of a ``max_tokens = 1`` chat
completion (the request's JSON, tokenizing, validation, the step, the response; client in the same process).

    python -m lab.scripts.served_chat --tokenizer DIR --contexts 32768,102400 --methods bf16,oscar --out DIR
"""

from __future__ import annotations

import json
import statistics
import time

from oscarkv.bench import e2e
from oscarkv.config import ServerConfig
from oscarkv.engine.async_engine import AsyncEngine
from oscarkv.engine.request import SamplingParams
from oscarkv.server.app import create_app, served_model
from oscarkv.server.launch import serving_in_thread
from lab.scripts.chat_followup import QUESTION, asked, document, follow_engine, grid


def one(model, tok, method: str, context: int, turns: int, kind: str = "turns", kv_bytes: int = 24 << 30) -> list[dict]:
    import openai

    llm = follow_engine(model, tok, method, kind, kv_bytes)
    msgs = [{"role": "user", "content": document(tok, context) + "\n" + QUESTION}]
    llm.add_request("doc", tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                    SamplingParams(max_tokens=1, ignore_eos=True))
    e2e.drive(llm)
    cfg = ServerConfig(served_model_name="m", default_max_tokens=1)
    engine, rows = AsyncEngine(llm), []
    try:
        with serving_in_thread(create_app(engine, served_model(llm, model.config, tok, "m", cfg), cfg)) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
            for i in range(turns + 1):
                for memo in (True, False):
                    llm.tokens.enabled = memo
                    t = time.perf_counter()
                    r = client.chat.completions.create(model="m", messages=asked(msgs, kind, i, memo), max_tokens=1,
                                                       temperature=0)
                    row = dict(method=method, context=context, memo=memo, turn=i, wall_s=time.perf_counter() - t,
                               prompt_tokens=r.usage.prompt_tokens, kind=kind)
                    if i:  # NOTE: turn 0 warms up (its staged graph is captured on the second sighting)
                        rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        engine.close()
    return rows


def table(rows: list[dict]) -> str:
    out = ["| context | kv | prompt tokens | first token, memo ms | first token, whole ms |", "|---:|---|---:|---:|---:|"]
    for c, m in dict.fromkeys((r["context"], r["method"]) for r in rows):
        sel = [r for r in rows if (r["context"], r["method"]) == (c, m)]
        med = lambda memo: 1e3 * statistics.median(r["wall_s"] for r in sel if r["memo"] == memo)  # noqa: E731
        out.append(f"| {c} | {m} | {sel[0]['prompt_tokens']} | {med(True):.1f} | {med(False):.1f} |")
    return "\n".join(out)


if __name__ == "__main__":
    grid(one, table, "served_chat")
