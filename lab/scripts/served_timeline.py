"""Where a served chat follow-up's time goes (issue 29 diagnostic): ``lab.scripts.served_chat``'s turns at one
context and KV method, with timestamps at the server's steps (the endpoint's tokenizing, the engine's validation,
its ``add`` and ``step``, the response body) and the client's call; prints the last turn's timeline (memo on).

    python -m lab.scripts.served_timeline --tokenizer DIR [--context 102400 --method oscar --shape qwen3-4b]
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

LOG: list[tuple[str, float, str]] = []


def _mark(name: str) -> None:
    LOG.append((name, time.perf_counter(), threading.current_thread().name))


def _wrap(owner, name: str, is_async: bool = False) -> None:
    f = getattr(owner, name)
    if is_async:
        async def g(*a, **k):
            _mark(name + ">")
            r = await f(*a, **k)
            _mark(name + "<")
            return r
    else:
        def g(*a, **k):
            _mark(name + ">")
            r = f(*a, **k)
            _mark(name + "<")
            return r
    setattr(owner, name, g)


def instrument() -> None:
    import openai

    from oscarkv.engine import engine
    from oscarkv.server import endpoints, state

    for owner, name, is_async in ((state.Server, "chat_ids", True), (state.Server, "prepare", True),
                                  (state.Server, "_chat_ids", False), (engine.LLMEngine, "add", False),
                                  (engine.LLMEngine, "step", False), (engine.LLMEngine, "validate", False),
                                  (endpoints, "_chat_body", False),
                                  (openai.resources.chat.completions.Completions, "create", False)):
        _wrap(owner, name, is_async)


def timeline(last: int = 1) -> str:
    starts = [i for i, (n, _, _) in enumerate(LOG) if n == "create>"]
    out = []
    for s in starts[-last:]:
        end = next(i for i in range(s, len(LOG)) if LOG[i][0] == "create<")
        out += [f"{(t - LOG[s][1]) * 1e3:8.2f} ms  {n:18s} {th}" for n, t, th in LOG[s:end + 1]]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--shape", default="qwen3-4b")
    ap.add_argument("--context", type=int, default=102400)
    ap.add_argument("--method", default="oscar")
    a = ap.parse_args()
    from transformers import AutoTokenizer

    from lab.scripts import served_chat
    from oscarkv.bench import e2e

    instrument()
    served_chat.one(e2e.random_model(a.shape), AutoTokenizer.from_pretrained(a.tokenizer), a.method, a.context, 2)
    print(timeline(2))


if __name__ == "__main__":
    main()
