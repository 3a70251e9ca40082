"""``oscarkv bench speculative``: batch-1 speculative decoding (n-gram drafts), with and without.

Two measurements, combined in a third table — each table says which it is:

1. **Real model** (``--model``, any device; the default model unless named): two greedy tasks that start with the
   same document (``document_tokens`` of ``oscarkv/data/gazetteer.txt``, cut at a line end): ``copy`` asks for
   the document repeated word for word (prompt-lookup drafts find what the model copies), ``no-copy`` for a story
   unrelated to it (drafts found in the document are mostly rejected). Per KV method and K (0 = no speculation,
   then each ``num_speculative_tokens``) one engine serves one untimed warm-up request, then each task: acceptance
   rate and tokens per decode step (the engine's :class:`~oscarkv.engine.speculative.SpecStats`, this task's
   share; ``graph`` the share of verify steps an extend CUDA graph ran as one chunk), ms per output token over the
   decode phase (first token to the last, wall), and whether the tokens equal those of K = 0 — where not, the
   first output position that differs, the largest log-probability difference of the tokens before it (rounding
   between the runs' step shapes: ~1e-2 in bf16) and the margin there: K = 0's log-probability of its token minus
   this run's of its own, both computed after the same tokens. A near-tie (two tokens within rounding) shows a
   margin near 0 after tiny differences; a bug, large differences before it or a large margin. Each engine as
   served: overlap on CUDA (with speculation, for steps whose draft gate is closed); with speculation its graphs for every verify size are
   captured when it is built (``ModelRunner.capture_graphs``), so no capture lands in a timed request.
2. **Verify-step cost at real shapes** (``--shapes``, CUDA; random weights, :mod:`oscarkv.bench.e2e`): random
   weights give no meaningful acceptance, so this times steps only. One ``context``-token request is filled fast,
   then ``steps`` engine steps are timed: a plain engine's decode steps (overlap on, as served, and off), and on an
   engine with speculation a drafter that proposes K random tokens every step (all rejected: each step verifies
   ``1 + K`` rows; the mean rows per step are reported). ``draft_end`` keeps a verify step from making the
   demotion of a recent page: a step ``d`` tokens before the next demotion (every ``page_size`` tokens, 64 by
   default) verifies at most ``d - 1`` drafts, so untimed plain steps first bring the request clear of a demotion
   for the timed steps (:func:`clear_span`); the projection refuses a cost whose steps still shrank. bf16 never demotes. Before timing, every graph the steps can
   replay is captured and one untimed step of each K runs; a row reports the graphs captured inside its timed
   steps (``captured``: 0 when warm) and the share of its verify steps an extend graph ran (``graph``).
3. **Projection** (both present): a task's ms per token at a shape = (verify steps × the verify-step cost at K +
   other decode steps × the sequential decode step) / decode steps / tokens per step — the step costs of (2),
   the acceptance counts of (1). It is a projection, not a measurement: the two come from different models.

NOTE: (2) replaces the engine's drafter (``scheduler.drafter``) to force K drafts per step.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

import torch

from oscarkv.bench import e2e
from oscarkv.bench.configs import SpeculativeBench
from oscarkv.config import EngineConfig, KVConfig, SpeculativeConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from oscarkv.engine.speculative import SpecStats
from oscarkv.quant.artifact import recipe_with

TASKS = {"copy": "Repeat the text above exactly, word for word, from its first line.",
         "no-copy": "Now, without quoting the text above, write a short story about a fox who learns to play the violin."}
"""The request after the document, per task."""


def document(tokenizer, n: int) -> str:
    """The first lines of the gazetteer holding at most ``n`` tokens."""
    from oscarkv.data import read_text

    lines, used = [], 0
    for line in read_text("gazetteer.txt").splitlines(keepends=True):
        used += len(tokenizer.encode(line, add_special_tokens=False))
        if used > n:
            break
        lines.append(line)
    return "".join(lines)


def task_prompts(tokenizer, n: int) -> dict[str, list[int]]:
    """Token ids of each task: the document, then the task's request, as one chat turn."""
    doc, out = document(tokenizer, n), {}
    for name, ask in TASKS.items():
        text = tokenizer.apply_chat_template([{"role": "user", "content": f"{doc}\n{ask}"}], tokenize=False,
                                             add_generation_prompt=True)
        out[name] = tokenizer.encode(text, add_special_tokens=False)
    return out


def _delta(after: SpecStats | None, before: SpecStats | None) -> SpecStats:
    if after is None:
        return SpecStats()
    return SpecStats(**{f.name: getattr(after, f.name) - getattr(before, f.name) for f in fields(SpecStats)})


def serve_one(engine: LLMEngine, rid: str, ids: list[int], max_tokens: int) -> dict:
    """One greedy request to completion: its tokens, the decode phase's wall time and steps, its speculative
    counters (``SpecStats`` of this request: zeros without speculation), the gate's floor after it and the engine's
    mean verify and plain step times (``step_ms``: what ``measured_floor`` reads)."""
    before = engine.stats().speculative
    engine.add_request(rid, ids, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=True))
    first, steps, out = None, 0, None
    while engine.has_unfinished():
        for o in engine.step():
            out = o
        steps += first is not None
        if first is None and out is not None and out.token_ids:
            e2e.sync()
            first, n_first = time.perf_counter(), len(out.token_ids)
    e2e.sync()
    if first is None or out.finish_reason == "error":
        raise RuntimeError(f"bench speculative: request {rid} failed (finish reason {out and out.finish_reason})")
    decode_s = time.perf_counter() - first
    st = _delta(engine.stats().speculative, before)
    return dict(tokens=out.token_ids, logprobs=out.logprobs, decode_steps=steps, ms_per_token=1e3 * decode_s / (len(out.token_ids) - n_first),
                acceptance_rate=st.acceptance_rate, tokens_per_step=st.tokens_per_step or 1.0,
                graph=st.graph_steps / st.verify_steps if st.verify_steps else 0.0, spec=asdict(st),
                floor=engine.spec.floor() if engine.spec else None,  # the gate's, after the request
                step_ms={k: 1e3 * v for k, v in engine.spec.costs.mean.items()} if engine.spec else None)


def task_rows(make_engine, prompts: dict[str, list[int]], method: str, ks: tuple[int, ...],
              max_tokens: int, repeats: int = 1) -> list[dict]:
    """Rows of one KV method: each task at K = 0 and each K (``make_engine(method, K)``: K = 0 without
    speculation), with ``tokens_equal`` against K = 0; a task served ``repeats`` times reports its median run by
    ms per token and every run's ms per token (``all_ms``); each row keeps its token ids (``output``, in the JSON
    only: ``lab/scripts/draft_gate_sim.py`` replays them)."""
    rows, ref = [], {}
    for k in (0, *ks):
        engine = make_engine(method, k)
        try:
            serve_one(engine, "warm-up", prompts["copy"], min(16, max_tokens))
            for task, ids in prompts.items():
                runs = sorted((serve_one(engine, f"{task}-{k}-{i}", ids, max_tokens) for i in range(repeats)),
                              key=lambda x: x["ms_per_token"])
                r = dict(runs[len(runs) // 2], all_ms=[x["ms_per_token"] for x in runs])
                got = r.pop("tokens"), r.pop("logprobs")
                ref.setdefault(task, got)
                rows.append(dict(part="model", method=method, task=task, k=k, prompt_tokens=len(ids),
                                 tokens_equal=got[0] == ref[task][0], **divergence(ref[task], got), **r))
                print(json.dumps(rows[-1]), flush=True)
                rows[-1]["output"] = got[0]  # NOTE: the JSON keeps the text, so draft gates replay offline
        finally:
            engine.close()
    return rows


def divergence(ref: tuple[list[int], list[float]], got: tuple[list[int], list[float]]) -> dict:
    """Where greedy outputs ``(tokens, logprobs)`` first differ (``first_diff``: output index, ``None`` if never),
    the largest log-probability difference of the tokens before it (``drift``), and the ``margin`` there: ``ref``'s
    log-probability of its token minus ``got``'s of its own (both after the same tokens; near 0: a near-tie)."""
    (a, la), (b, lb) = ref, got
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    n = min(len(a), len(b)) if i is None else i
    drift = max((abs(x - y) for x, y in zip(la[:n], lb[:n])), default=0.0)
    return dict(first_diff=i, drift=drift, margin=None if i is None else la[i] - lb[i])


def model_engine_factory(loaded, artifact, given: dict | None = None, kv_bytes: int = 1 << 28,
                         gate: dict | None = None):
    """``make_engine(method, K)`` for :func:`task_rows` on a loaded real model (ngram drafts when K > 0); OSCAR with
    the artifact's recipe, as ``LLM`` and ``serve`` apply it (the default model's: pages of 16, sink 16, 4-bit keys in
    42 heads), and the fields ``given`` sets over it (``quant.artifact.recipe_with``; ``{"sink": 64}`` as ``--sink 64``);
    ``gate``: the draft gate's ``SpeculativeConfig`` fields (``min_accepted_tokens``, ``measured_floor``)."""
    def make(method: str, k: int) -> LLMEngine:
        spec = SpeculativeConfig("ngram", num_speculative_tokens=k, **(gate or {})) if k else SpeculativeConfig()
        art = artifact if method == "oscar" else None
        kv = recipe_with(KVConfig(method), art, given or {}) if art is not None else KVConfig(method)
        cfg = EngineConfig(kv, kv_memory_bytes=kv_bytes, max_num_seqs=4, speculative=spec)
        return LLMEngine.from_hf(loaded.model, cfg, art, loaded.tokenizer)
    return make


class ForcedDrafter:
    """A drafter proposing ``k`` random tokens every step (random weights reject them): verify steps of 1 + k rows."""

    def __init__(self, k: int, vocab: int) -> None:
        self.k, self.vocab, self.g = k, vocab, torch.Generator().manual_seed(k)

    def __call__(self, seq, limit: int) -> list[int]:
        return torch.randint(0, self.vocab, (min(self.k, limit),), generator=self.g).tolist()


def timed_rows(engine: LLMEngine, steps: int) -> dict:
    """µs per engine step over ``steps`` steps (after one untimed step), the mean tokens run per model launch in
    them, the graphs captured while timed (0 when warm) and the share of verify steps an extend graph ran."""
    from oscarkv.bench.decode import timed_steps

    n, graphs = len(engine.runner.launches), engine.runner.num_graphs()
    before = replace(engine.spec.stats) if engine.spec else None
    us = timed_steps(engine, steps)
    launched = [launch.tokens for launch in engine.runner.launches[n:] if launch.batch]
    st = _delta(engine.spec.stats if engine.spec else None, before)
    return dict(step_us=us, rows_per_step=sum(launched) / max(len(launched), 1),
                captured=engine.runner.num_graphs() - graphs,
                graph=st.graph_steps / st.verify_steps if st.verify_steps else 0.0)


def clear_span(engine: LLMEngine, span: int) -> None:
    """Untimed plain decode steps until the next ``span`` tokens of the one request make no demotion, so that every
    timed step verifies all its drafts (``KVCacheManager.draft_end``: a step ``d`` tokens before a demotion verifies
    at most ``d - 1``); at most ``page_size`` + ``span`` steps (a span longer than a page never clears)."""
    seq, manager = engine.scheduler.running[0], engine.manager
    for _ in range(manager.P + span):
        n = seq.kv.num_tokens
        if manager.draft_end(seq, n + 1, n + 1 + span) == n + 1 + span:
            return
        engine.step()


def verify_cost(engine: LLMEngine, ctx: int, ks: tuple[int, ...], steps: int) -> list[dict]:
    """On an engine with speculation: one ``ctx``-token request; sequential decode steps (no drafts), then the
    steps of each K (:class:`ForcedDrafter`), timed where no demotion cuts their drafts short (:func:`clear_span`)."""
    P = engine.manager.P
    e2e.add_prompts(engine, 1, ctx, 8 + (2 + len(ks)) * (steps + 2) + len(ks) * (P + steps + max(ks)), seed=ctx)
    e2e.drive(engine, max_steps=4)  # fill and first tokens
    engine.runner.capture_graphs(1 + max(ks))  # NOTE: done when built (speculation on); a no-op unless not
    drafter, out = engine.scheduler.drafter, []
    try:
        for k in (0, *ks):
            engine.scheduler.drafter = None
            if k:
                clear_span(engine, steps + 2 + k)
            engine.scheduler.drafter = ForcedDrafter(k, engine.vocab_size) if k else None
            out.append(dict(k=k, **timed_rows(engine, steps)))
    finally:
        engine.scheduler.drafter = drafter
        for seq in list(engine.scheduler.running):
            engine.abort(seq.request_id)
        engine.drain()
    return out


def shape_rows(model, cfg: SpeculativeBench, shape: str = "") -> list[dict]:
    """Verify-step cost rows of one model (any device; random weights at real shapes on a GPU)."""
    rows, kv = [], int(cfg.kv_gib * 2**30)
    for method in cfg.methods:
        plain = e2e.build_engine(model, method, kv, 1, 8192)
        spec = e2e.bench_engine(model, replace(plain.cfg, speculative=SpeculativeConfig(
            cfg.speculative, num_speculative_tokens=max(cfg.num_speculative_tokens))),
            e2e.random_artifact(model.config) if method == "oscar" else None)
        try:
            for ctx in cfg.contexts:
                e2e.add_prompts(plain, 1, ctx, 2 * cfg.steps + 16, seed=ctx)
                e2e.drive(plain, max_steps=4)
                overlap_us = timed_rows(plain, cfg.steps)["step_us"]
                for seq in list(plain.scheduler.running):
                    plain.abort(seq.request_id)
                plain.drain()
                for r in verify_cost(spec, ctx, cfg.num_speculative_tokens, cfg.steps):
                    rows.append(dict(part="shape", shape=shape, method=method, context=ctx,
                                     decode_overlap_us=overlap_us, **r))
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            plain.close(), spec.close()
            del plain, spec
            e2e.release()
    return rows


def projection(model_rows: list[dict], shape_rows_: list[dict]) -> list[dict]:
    """Per (shape, context, method, task, K): the projected ms per token (module docstring) and its speed-up over
    the plain engine's decode step (overlap on) at the same shape and context."""
    out = []
    cost = {(r["shape"], r["context"], r["method"], r["k"]): r for r in shape_rows_}
    for r in (r for r in model_rows if r["k"]):
        for (shape, ctx, method, k), c in cost.items():
            # NOTE: timed verify steps that shrank before a demotion (rows/step well below 1 + K) cost less than
            # the K-draft steps the real model's counts describe: no projection from them
            if (method, k) != (r["method"], r["k"]) or c.get("rows_per_step", 1 + k) < 0.9 * (1 + k):
                continue
            dec, st = cost[shape, ctx, method, 0], r["spec"]
            other = st["decode_steps"] - st["verify_steps"]
            step_us = (st["verify_steps"] * c["step_us"] + other * dec["step_us"]) / max(st["decode_steps"], 1)
            ms = step_us / 1e3 / r["tokens_per_step"]
            out.append(dict(shape=shape, context=ctx, method=method, task=r["task"], k=k, ms_per_token=ms,
                            plain_ms=dec["decode_overlap_us"] / 1e3, speedup=dec["decode_overlap_us"] / 1e3 / ms))
    return out


def run(cfg: SpeculativeBench, loaded, artifact, out: Path | None, given: dict | None = None) -> str:
    """Both parts (the shapes only on CUDA), their tables and the projection; JSON to ``out``; ``given``: fields over
    OSCAR's recipe on the real model (the bench's ``--sink`` etc.)."""
    prompts = task_prompts(loaded.tokenizer, cfg.document_tokens)
    make = model_engine_factory(loaded, artifact, given, gate=dict(min_accepted_tokens=cfg.min_accepted_tokens,
                                                                   measured_floor=cfg.measured_floor))
    rows = [r for m in cfg.methods
            for r in task_rows(make, prompts, m, cfg.num_speculative_tokens, cfg.max_tokens, cfg.repeats)]
    if cfg.shapes and not torch.cuda.is_available():
        raise ValueError("bench speculative --shapes needs a CUDA device")
    for shape in cfg.shapes:
        model = e2e.random_model(shape)
        rows += shape_rows(model, cfg, shape)
        del model
        e2e.release()
    proj = projection([r for r in rows if r["part"] == "model"], [r for r in rows if r["part"] == "shape"])
    e2e.write_json(out, cfg, rows, projection=proj, prompts=prompts, recipe_overrides=given or {})
    over = ", ".join(f"{k} {v}" for k, v in (given or {}).items()) or "none"
    floor = "measured (each engine's step times)" if cfg.measured_floor else f"at least {cfg.min_accepted_tokens}"
    return (f"draft gate: {floor} accepted drafts per verify step; over OSCAR's recipe: "
            f"{over}\n" + format_tables(rows, proj))


def format_tables(rows: list[dict], proj: list[dict]) -> str:
    """The real model's table; with shapes, the verify-step costs and the projection."""
    parts = [model_table([r for r in rows if r["part"] == "model"])]
    shaped = [r for r in rows if r["part"] == "shape"]
    if shaped:
        parts += [shape_table(shaped), projection_table(proj)]
    return "\n\n".join(parts)


def model_table(rows: list[dict]) -> str:
    """Measured on the real model: acceptance, tokens per step, ms per output token and the speed-up over K = 0."""
    base = {(r["method"], r["task"]): r["ms_per_token"] for r in rows if r["k"] == 0}
    lines = ["measured, real model, batch 1 (greedy):",
             "| kv | task | K | acceptance | tokens/step | graph | decode steps | ms/token | speed-up vs K = 0 "
             "| tokens equal | first diff (drift before, margin) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        acc, graph = (f"{r['acceptance_rate']:.2f}", f"{r['graph']:.2f}") if r["k"] else ("-", "-")
        diff = "-" if r["first_diff"] is None else f"{r['first_diff']} ({r['drift']:.3f}, {r['margin']:.3f})"
        lines.append(f"| {r['method']} | {r['task']} | {r['k']} | {acc} | {r['tokens_per_step']:.2f} | {graph} | "
                     f"{r['decode_steps']} | {_ms_cell(r)} | "
                     f"{base[r['method'], r['task']] / r['ms_per_token']:.2f}x | {r['tokens_equal']} | {diff} |")
    return "\n".join(lines)


def _ms_cell(r: dict) -> str:
    """ms per token; with repeats, the median and the range of the runs."""
    runs = r.get("all_ms") or [r["ms_per_token"]]
    return f"{r['ms_per_token']:.2f}" + (f" ({min(runs):.2f}-{max(runs):.2f})" if len(runs) > 1 else "")


def shape_table(rows: list[dict]) -> str:
    """Measured at real shapes (random weights): a verify step of K drafts against a decode step."""
    dec = {(r["shape"], r["context"], r["method"]): r["step_us"] for r in rows if r["k"] == 0}
    lines = ["measured, random weights at real shapes, batch 1: engine step ms",
             "| shape | context | kv | K | rows/step | graph | captured | step ms | / decode step (sequential) "
             "| decode ms, overlap on |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        d = dec[r["shape"], r["context"], r["method"]]
        lines.append(f"| {r['shape']} | {r['context']} | {r['method']} | {r['k']} | {r['rows_per_step']:.2f} | "
                     f"{r['graph']:.2f} | {r['captured']} | {r['step_us'] / 1e3:.2f} | {r['step_us'] / d:.2f}x | "
                     f"{r['decode_overlap_us'] / 1e3:.2f} |")
    return "\n".join(lines)


def projection_table(proj: list[dict]) -> str:
    """Projected: step costs at the shapes × the real model's acceptance counts (module docstring)."""
    lines = ["projected (step cost at the shape x the real model's acceptance; not a measurement):",
             "| shape | context | kv | task | K | ms/token | plain decode ms/token (overlap) | speed-up |",
             "|---|---:|---|---|---:|---:|---:|---:|"]
    for p in proj:
        lines.append(f"| {p['shape']} | {p['context']} | {p['method']} | {p['task']} | {p['k']} | "
                     f"{p['ms_per_token']:.2f} | {p['plain_ms']:.2f} | {p['speedup']:.2f}x |")
    return "\n".join(lines)
