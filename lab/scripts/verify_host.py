"""Where a speculative verify step's host time goes, without a profiler (issue 29 diagnostic, one GPU).

A verify step cannot be launched ahead (its drafts need the last step's tokens), so everything the host does between
one step's end on the GPU and the next step's launch leaves the GPU idle: ``verify_profile`` found ~1 ms of it a step
at 100K (Qwen3-4B shape, K = 2-8), where a decode step hides its host work. Here each engine step is cut into the GPU
wait (a stream sync at the start of ``LLMEngine._complete``) and the host phases around it, timed by wrappers around
the engine's own methods (inclusive times: ``plan`` runs inside ``schedule``), with Python's garbage collections
counted and timed per generation (none ran in these steps, 2026-11-29); the same steps with the greedy tokens and
log-probs formed inside the extend graph (``speculative.greedy_pair``, the default) and after the replay. The draft gate stays open (``min_accepted_tokens`` 0: random drafts are rejected). Writes ``verify_host.json``.

    python -m lab.scripts.verify_host --shape qwen3-4b --context 102400 --ks 4 --out DIR
"""

from __future__ import annotations

import gc
import json
import time
from collections import defaultdict

import torch

from oscarkv.bench import e2e
from oscarkv.bench.speculative import ForcedDrafter, clear_span
from lab.scripts.verify_profile import parser, spec_engine


class Phases:
    """Inclusive seconds per wrapped method, and Python's collections (count, seconds) per generation."""

    def __init__(self) -> None:
        self.s, self.gc, self._t = defaultdict(float), defaultdict(lambda: [0, 0.0]), 0.0

    def wrap(self, obj, name: str, label: str, sync: bool = False) -> None:
        f = getattr(obj, name)

        def timed(*a, **k):
            if sync:  # the GPU wait, apart from what the method does after it
                t = time.perf_counter()
                torch.cuda.current_stream().synchronize()
                self.s["gpu wait"] += time.perf_counter() - t
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                self.s[label] += time.perf_counter() - t
        setattr(obj, name, timed)

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            g = self.gc[info["generation"]]
            g[0], g[1] = g[0] + 1, g[1] + time.perf_counter() - self._t


def instrument(engine) -> Phases:
    ph = Phases()
    ph.wrap(engine, "_complete", "complete (after the wait)", sync=True)
    ph.wrap(engine.scheduler, "schedule", "schedule")
    ph.wrap(engine.scheduler, "drafter", "draft")
    ph.wrap(engine.manager, "plan", "manager.plan")
    ph.wrap(engine.manager, "truncate", "manager.truncate")
    ph.wrap(engine.manager, "commit", "manager.commit")
    ph.wrap(engine.runner, "run", "runner.run (stage + launch)")
    ph.wrap(engine.spec, "accept", "spec.accept")
    return ph


def timed(engine, ph: Phases, steps: int) -> dict:
    engine.step()
    ph.s.clear()
    ph.gc.clear()
    gc.callbacks.append(ph.on_gc)
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    wall = time.perf_counter() - t
    gc.callbacks.remove(ph.on_gc)
    per = {k: round(1e6 * v / steps, 1) for k, v in sorted(ph.s.items(), key=lambda kv: -kv[1])}
    return dict(step_us=round(1e6 * wall / steps, 1), host_us=round(1e6 * (wall - ph.s["gpu wait"]) / steps, 1),
                phases_us=per, gc={g: (n, round(1e6 * s, 1)) for g, (n, s) in ph.gc.items()})


def main() -> None:
    ap = parser("4", 12)
    ap.add_argument("--method", default="oscar")
    a = ap.parse_args()
    ks = [int(x) for x in a.ks.split(",")]
    engine = spec_engine(e2e.random_model(a.shape), a.method, a.kv_gib, max(ks), min_accepted_tokens=0.0)
    e2e.add_prompts(engine, 1, a.context, 64 + len(ks) * 2 * (4 * a.steps + 2 + engine.manager.P + max(ks)),
                    seed=a.context)
    e2e.drive(engine, max_steps=4)
    ph, res, graphs = instrument(engine), [], engine.runner.extend_graphs
    for pair in (True, False):
        graphs.greedy = pair
        graphs.graphs.clear()  # recaptured at the next step of each bucket, with or without the pair
        for k in ks:
            engine.scheduler.drafter = None
            clear_span(engine, 2 * a.steps + 8 + k)
            engine.scheduler.drafter = ForcedDrafter(k, engine.vocab_size)
            ph.wrap(engine.scheduler, "drafter", "draft")
            r = dict(k=k, greedy_pair_in_graph=pair, **timed(engine, ph, a.steps))
            print(json.dumps(r), flush=True)
            res.append(r)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "verify_host.json").write_text(json.dumps(dict(shape=a.shape, context=a.context, method=a.method,
                                                            rows=res), indent=1))


if __name__ == "__main__":
    main()
