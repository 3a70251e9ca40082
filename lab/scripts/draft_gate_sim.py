"""Replay greedy outputs (no speculation) through a draft gate in the engine's order: the eleventh session's
development set for ``DraftGate`` (shadow drafts while closed) against the gate before it (blind probes after
pauses of 2, 4, ... 64 steps; ``lab/results/draft_gate/gate_before.txt``, the module as it was).

Greedy verification accepts exactly the drafts' prefix equal to the tokens the run emits, so a gate's verify
steps and tokens per step follow from the output alone; the cost is in units of a plain decode step run ahead
(overlap): a verify step ``v``, a plain step that was not run ahead ``u`` (two settings: the default model on an
H200, ~2.3 / 1.6, and Qwen3-4B at 100K, ~1.45 / 1.05). A closed gate decides one token late (a step run ahead is
planned before its input token reaches the host).

Usage (repository root): python lab/scripts/draft_gate_sim.py lab/results/draft_gate/dev_*.json
(``lab/scripts/draft_gate_dev.py`` writes those: the default model on the CPU over our own docs); a ``bench
speculative`` JSON also replays, each method's K = 0 outputs (as the GPU served them) under its name."""

import importlib.machinery
import importlib.util
import json
import math
import sys
from collections import defaultdict
from types import SimpleNamespace

import oscarkv.engine.speculative as current
from oscarkv.config import SpeculativeConfig

_loader = importlib.machinery.SourceFileLoader("gate_before", "lab/results/draft_gate/gate_before.txt")
_spec = importlib.util.spec_from_loader("gate_before", _loader)
before = importlib.util.module_from_spec(_spec)
sys.modules["gate_before"] = before
_loader.exec_module(before)


class Seq:
    def __init__(self, ids):
        self.token_ids = ids


def replay(mod, prompt: list[int], out: list[int], k: int, cost: tuple[float, float], lag: bool, gate=None,
           limit=None) -> dict:
    """Steps, verify steps and speed-up (tokens per cost unit) of one output under ``mod``'s gate (``gate``: this
    one instead); ``limit(t)``: the most drafts a step to ``t`` tokens may add (``KVCacheManager.draft_end``)."""
    v, u = cost
    floor = {} if gate is None else {"min_accepted_tokens": gate.floor}  # NOTE: the decoder resets gates' floors from it
    cfg = SpeculativeConfig("ngram", num_speculative_tokens=k, **floor)
    if mod is before:  # NOTE: its gate read a share of the drafts, 0.25 then (min_acceptance)
        cfg = SimpleNamespace(**vars(cfg), min_acceptance=0.25)
    dec = mod.SpeculativeDecoder(cfg)
    seq, pos, ahead_ok, spent, steps, verify = Seq(list(prompt) + out[:1]), 1, False, 0.0, 0, 0
    if gate is not None:
        dec._gate[seq] = gate
    while pos < len(out):
        steps += 1
        if ahead_ok:
            last = seq.token_ids.pop() if lag else None
            go = dec.drafts_next(seq)
            if lag:
                seq.token_ids.append(last)
            if not go:
                dec.skip(seq)
                spent, pos = spent + 1, pos + 1
                seq.token_ids.append(out[pos - 1])
                continue
        drafts = dec.propose(seq, len(out) - pos if limit is None else min(len(out) - pos, limit(len(seq.token_ids) + 1)))
        if drafts:
            a = next((j for j, d in enumerate(drafts) if d != out[pos + j]), len(drafts))
            if seq in dec._gate:
                dec._gate[seq].update(len(drafts), a)
            emitted, spent, ahead_ok, verify = a + 1, spent + v, False, verify + 1
        else:
            emitted, spent, ahead_ok = 1, spent + u, True
        seq.token_ids += out[pos:pos + emitted]
        pos += emitted
    return dict(steps=steps, verify=verify, speedup=(len(out) - 1) / spent)


def tasks(path: str) -> dict:
    """``{task: {"prompt", "output"}}`` of a development file, or of a ``bench speculative`` JSON (its K = 0 rows)."""
    d = json.load(open(path))
    if "rows" not in d:
        return d
    return {f"{r['method']}-{r['task']}": dict(prompt=d["prompts"][r["task"]], output=r["output"])
            for r in d["rows"] if r.get("part") == "model" and r["k"] == 0 and "output" in r}


def main(files: list[str]) -> None:
    for cost in ((2.3, 1.6), (1.45, 1.05)):
        print(f"== verify step {cost[0]}, plain step not run ahead {cost[1]} (plain steps run ahead: 1)")
        logs = defaultdict(lambda: [[], []])
        for k in (2, 4, 8):
            for f in files:
                for task, d in tasks(f).items():
                    r0 = replay(before, d["prompt"], d["output"], k, cost, False)
                    r1 = replay(current, d["prompt"], d["output"], k, cost, True)
                    logs[k][0].append(r0["speedup"]), logs[k][1].append(r1["speedup"])
                    print(f"K={k} {f.split('/')[-1]:16s} {task:8s} before {r0['speedup']:.2f}x ({r0['verify']:3d} verify "
                          f"of {r0['steps']:3d}) now {r1['speedup']:.2f}x ({r1['verify']:3d} of {r1['steps']:3d})")
        for k, (a, b) in logs.items():
            print(f"K={k}: geometric mean before {math.exp(sum(map(math.log, a)) / len(a)):.3f}x, now "
                  f"{math.exp(sum(map(math.log, b)) / len(b)):.3f}x; worst {min(a):.2f}x / {min(b):.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
