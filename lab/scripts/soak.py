"""Soak test of ``oscarkv serve`` on loopback: bounded, self-stopping, outside the default test suite.

The default model (SmolLM2-135M, fp32) is served in this process on a free loopback port; the
official async ``openai`` client sends ``--requests`` streamed requests, ``--concurrency`` in
flight. Each request draws (fixed ``--seed``) chat or completions, greedy or seeded sampling, one
of ``--distinct`` prompts (a shared passage longer than the BF16 sink and window, so INT2 history
pages are written, then a question of its own), and whether the client disconnects after its
first 1-3 chunks (``--disconnect``, a fifth by default). Checks:

* every request that was not disconnected is answered to its end (a finish reason, ``[DONE]``);
* every greedy survivor's text equals ``LLM.generate`` of the same token ids and settings;
* no 5xx: none seen by the client, none in ``/metrics``;
* afterwards no KV page is held and nothing queued or running, and the RSS is back to its
  baseline (taken after a warm-up wave of ``--concurrency`` requests) within ``--rss-slack-mb``.

Prints one JSON line of results (its figures go in docs/BENCHMARKS.md, "Server soak"); exit
status 1 when a check fails. Everything is bounded by ``--timeout`` seconds.

    OMP_NUM_THREADS=2 python -m lab.scripts.soak --requests 512 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import time
from dataclasses import asdict, dataclass

import openai

from oscarkv.calibrate.default import artifact_for
from oscarkv.config import EngineConfig, KVConfig, ServerConfig
from oscarkv.data import read_text
from oscarkv.engine.async_engine import AsyncEngine
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from oscarkv.llm import LLM
from oscarkv.models.loader import load_model
from oscarkv.server.app import create_app, served_model
from oscarkv.server.launch import serving_in_thread

MODEL = "default"


@dataclass(frozen=True)
class Plan:
    """One request of the soak."""

    index: int
    chat: bool
    prompt: int  # which of the distinct prompts
    seed: int | None  # None: greedy
    disconnect_after: int  # chunks read before leaving; 0: read to the end


@dataclass
class Outcome:
    plan: Plan
    text: str = ""
    finish: str | None = None
    status: int | None = None  # an HTTP error status, if any
    error: str | None = None
    left: bool = False


def plans(args) -> list[Plan]:
    rng = random.Random(args.seed)
    return [Plan(i, rng.random() < 0.5, rng.randrange(args.distinct), None if rng.random() < 0.5 else i,
                 rng.randint(1, 3) if rng.random() < args.disconnect else 0) for i in range(args.requests)]


def prompts(tok, n: int) -> tuple[list[str], list[list[int]], list[list[int]]]:
    """The texts and the token ids the server makes of them: completions (``tok(text)``) and chat
    (the chat template, then ``tok(..., add_special_tokens=False)``), as ``oscarkv.server.state`` does."""
    passage = " ".join(read_text("calibration.txt").split()[:400])
    texts = [f"{passage}\n\nQuestion {i}: in one sentence, what is {i} plus {2 * i + 1}?" for i in range(n)]
    completion = [tok(t).input_ids for t in texts]
    chat = [tok(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True),
                add_special_tokens=False).input_ids for t in texts]
    return texts, completion, chat


def sampling(plan: Plan, max_tokens: int) -> dict:
    if plan.seed is None:
        return dict(max_tokens=max_tokens, temperature=0)
    return dict(max_tokens=max_tokens, temperature=0.8, top_p=0.95, seed=plan.seed)


async def one(client: openai.AsyncOpenAI, plan: Plan, texts: list[str], max_tokens: int) -> Outcome:
    out, kw = Outcome(plan), sampling(plan, max_tokens) | dict(model=MODEL, stream=True)
    try:
        if plan.chat:
            stream = await client.chat.completions.create(messages=[{"role": "user", "content": texts[plan.prompt]}], **kw)
        else:
            stream = await client.completions.create(prompt=texts[plan.prompt], **kw)
        chunks = 0
        async for chunk in stream:
            chunks += 1
            for c in chunk.choices:
                out.text += (c.delta.content or "") if plan.chat else c.text
                out.finish = c.finish_reason or out.finish
            if plan.disconnect_after and chunks >= plan.disconnect_after:
                await stream.close()  # the connection closes mid-stream: the server aborts the request
                out.left = True
                break
    except openai.APIStatusError as e:
        out.status, out.error = e.status_code, str(e)
    except openai.APIError as e:  # an error event inside the stream, or the connection failed
        out.error = f"{type(e).__name__}: {e}"
    return out


async def wave(url: str, batch: list[Plan], texts: list[str], args) -> list[Outcome]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=args.timeout)
    sem, done, start = asyncio.Semaphore(args.concurrency), [0], time.perf_counter()

    async def limited(plan: Plan) -> Outcome:
        async with sem:
            out = await one(client, plan, texts, args.max_tokens)
        done[0] += 1
        if done[0] % args.concurrency == 0 or done[0] == len(batch):
            print(f"soak: {done[0]}/{len(batch)} requests done, {time.perf_counter() - start:.0f} s", file=sys.stderr)
        return out

    try:
        return await asyncio.gather(*[limited(p) for p in batch])
    finally:
        await client.close()


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def settle(engine: LLMEngine, timeout: float = 30.0) -> dict:
    """The engine's pages in use, queue and running batch once it is idle (or ``timeout`` passed)."""
    end = time.monotonic() + timeout
    while True:
        s = engine.stats()
        state = {"pages_used": sum(t.pages_used for t in s.tiers.values()), "waiting": s.waiting, "running": s.running}
        if not any(state.values()) or time.monotonic() > end:
            return state
        time.sleep(0.05)


def http_statuses(url: str) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            if s.name == "oscarkv_http_responses_total":
                out[s.labels["status"]] = out.get(s.labels["status"], 0) + s.value
    return out


def references(loaded, cfg: EngineConfig, artifact, ids: dict[bool, list[list[int]]], max_tokens: int) -> dict:
    """Greedy ``LLM.generate`` text of every distinct (chat, prompt), on an engine of its own."""
    llm = LLM(loaded, kv=cfg.kv.method, config=cfg, artifact=artifact)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0)
    ref = {(chat, i): o.text for chat in (False, True) for i, o in enumerate(llm.generate(ids[chat], sp))}
    llm.close()
    return ref


def check(outcomes: list[Outcome], ref: dict, statuses: dict, after: dict, rss: tuple[float, float], args) -> dict:
    survivors = [o for o in outcomes if not o.plan.disconnect_after]
    greedy = [o for o in survivors if o.plan.seed is None]
    res = {"requests": len(outcomes), "concurrency": args.concurrency, "max_tokens": args.max_tokens,
           "kv": args.kv, "chat": sum(o.plan.chat for o in outcomes),
           "seeded": sum(o.plan.seed is not None for o in outcomes),
           "disconnected": sum(o.left for o in outcomes), "planned_disconnects": len(outcomes) - len(survivors),
           "survivors_answered": sum(o.finish is not None and o.error is None for o in survivors),
           "survivors": len(survivors), "greedy_checked": len(greedy),
           "greedy_equal": sum(o.text == ref[(o.plan.chat, o.plan.prompt)] for o in greedy),
           "client_errors": sum(o.error is not None for o in outcomes),
           "http_5xx": int(sum(v for k, v in statuses.items() if k.startswith("5"))),
           "http_statuses": {k: int(v) for k, v in sorted(statuses.items())}, **after,
           "rss_baseline_mb": round(rss[0], 1), "rss_after_mb": round(rss[1], 1)}
    res["ok"] = (res["survivors_answered"] == res["survivors"] and res["greedy_equal"] == res["greedy_checked"]
                 and res["http_5xx"] == 0 and res["client_errors"] == 0 and not any(after.values())
                 and rss[1] - rss[0] <= args.rss_slack_mb)
    res["failures"] = [asdict(o.plan) | {"error": o.error} for o in outcomes if o.error][:5]
    return res


def soak(args) -> dict:
    loaded = load_model(MODEL, "float32")
    cfg = EngineConfig(KVConfig(args.kv), kv_memory_bytes=args.kv_memory_mb << 20, max_num_seqs=args.concurrency)
    artifact = artifact_for(loaded, args.kv, None)
    texts, completion_ids, chat_ids = prompts(loaded.tokenizer, args.distinct)
    ref = references(loaded, cfg, artifact, {False: completion_ids, True: chat_ids}, args.max_tokens)
    llm = LLMEngine.from_hf(loaded.model, cfg, artifact, loaded.tokenizer)
    engine = AsyncEngine(llm)
    scfg = ServerConfig(served_model_name=MODEL)
    app = create_app(engine, served_model(llm, loaded.config, loaded.tokenizer, MODEL, scfg), scfg)
    todo = plans(args)
    try:
        with serving_in_thread(app) as url:
            start = time.perf_counter()
            warm = asyncio.run(wave(url, [Plan(-1 - i, i % 2 == 0, i % args.distinct, None, 0)
                                          for i in range(args.concurrency)], texts, args))
            settle(llm)
            gc.collect()
            baseline = rss_mb()
            outcomes = asyncio.run(asyncio.wait_for(wave(url, todo, texts, args), args.timeout))
            after = settle(llm)
            gc.collect()
            res = check(outcomes, ref, http_statuses(url), after, (baseline, rss_mb()), args)
            res["warmup_errors"] = sum(o.error is not None for o in warm)
            res["seconds"] = round(time.perf_counter() - start, 1)
    finally:
        engine.close()
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--distinct", type=int, default=16, help="distinct prompts (shared passage, own question)")
    p.add_argument("--disconnect", type=float, default=0.2, help="share of requests that leave mid-stream")
    p.add_argument("--kv", default="oscar", choices=("bf16", "naive", "quarot", "oscar"))
    p.add_argument("--kv-memory-mb", type=int, default=512)
    p.add_argument("--rss-slack-mb", type=float, default=64.0, help="RSS growth over the baseline still accepted")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before the soak gives up")
    res = soak(p.parse_args(argv))
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
