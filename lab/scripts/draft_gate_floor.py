"""The draft gate's floor replayed over development text, on the CPU (issue 29, development only; lab code).

``bench speculative``'s copy task (the evaluation) served 2.23 tokens a step at K = 8 with BF16 where drafting at every
step would have given 3.4 (twenty-sixth session, replaying its K = 0 text): the gate (``DraftGate``: open while an
average of accepted / drafted is at least ``min_acceptance`` 0.25) closes on text that copies in short runs. A ratio
floor asks K = 8 for twice the accepted tokens K = 4 needs, while a verify step of 9 rows costs about what one of 5 does
(``bench speculative``'s shapes: 1.53 against 1.41 decode steps at 32K). This replays, as ``draft_gate_sim.py`` does
(the engine's order, overlap, a closed gate deciding one token late), the floors 0.25 (shipped), 0.15, 0.1, 0.05 and
0 (always drafting), and a floor in *tokens* (``tokensN``: open while the average accepted tokens of a verify step is
at least N; the engine's gate since), over development text only: ``lab/results/draft_gate/dev_*.json`` (our docs, five tasks) and
``lab/results/spec_draft_policies/text_*.json`` (dev gazetteers and calibration prose, copy and no-copy), at the
default model's step costs on an H200 (verify 2.3, plain step not run ahead 1.6, in plain steps run ahead) and
Qwen3-4B's at 100K (1.45 / 1.05), with the drafts capped before a demotion as the shipped recipe's pages of 16 cap them.

    OMP_NUM_THREADS=1 python lab/scripts/draft_gate_floor.py --out lab/results/draft_gate_floor
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import spec_draft_policies as P  # noqa: E402
import draft_gate_sim as sim  # noqa: E402

from oscarkv.engine import speculative as S  # noqa: E402

COSTS = {"default-h200": (2.3, 1.6), "qwen3-4b-100k": (1.45, 1.05)}
# Per K, as the twenty-seventh session measured them on one H200 (2026-11-29): the default model as served with the
# 42-head recipe, BF16 and OSCAR (lab/bench_gpu/2026-11-28/s27_call7_h200/gate_1, s27_call8_h200/gate_2: a row's mean
# verify step ms over its K = 0 ms per token; a plain step not run ahead fitted from the mean plain step ms, one such
# step after each verify step, the others at K = 0's, rounded over rows: 0.9-1.7 for OSCAR, 1.0-1.3 for BF16);
# Qwen3-4B's verify step over its decode step at 100K (s27_call3_h200/gate_4; its decode step gains nothing from overlap)
MEASURED = {"default-oscar-s27": {2: (1.8, 1.4), 4: (1.85, 1.4), 8: (2.05, 1.4)},
            "default-bf16-s27": {2: (1.35, 1.08), 4: (1.37, 1.08), 8: (1.62, 1.08)},
            "qwen3-4b-100k-oscar-s27": {2: (1.33, 1.05), 4: (1.62, 1.05), 8: (1.94, 1.05)},
            "qwen3-4b-100k-bf16-s27": {2: (1.53, 1.05), 4: (1.69, 1.05), 8: (2.0, 1.05)}}


class RatioGate(S.DraftGate):
    """The gate as shipped before (2026-11-29): its average and floor a share of the drafts (``min_acceptance``)."""

    def score(self, accepted: int, drafted: int) -> float:
        return accepted / drafted


def replay(prompt, out, k: int, rule: str, cost, limit) -> float:
    """Tokens per cost unit of one output: ``draft_gate_sim.replay`` with ``rule``'s gate, drafts capped by ``limit``."""
    token_rule = rule.startswith("tokens")
    floor = float(rule[6:]) if token_rule else float(rule)
    gate = S.DraftGate(floor) if token_rule else RatioGate(floor)  # NOTE: the engine's gate counts tokens
    return sim.replay(S, prompt, out, k, cost, True, gate, limit)["speedup"]


def dev_set() -> dict[str, tuple[list[int], list[int]]]:
    """name -> (prompt ids, greedy output) of every development text."""
    from oscarkv.cli.flags import load

    got = {}
    for f in sorted(Path("lab/results/draft_gate").glob("dev_*.json")):
        for task, d in json.loads(f.read_text()).items():
            got[f"{f.stem}-{task}"] = d["prompt"], d["output"]
    tok = load("default", "float32", "cpu").tokenizer
    docs = P.dev_documents(tok, 6144, 4)
    for name, doc in docs.items():
        for task, ask in P.TASKS.items():
            f = Path(f"lab/results/spec_draft_policies/text_{name}_{task}.json")
            if f.exists():
                got[f"{name}-{task}"] = P.prompt_ids(tok, doc, ask), json.loads(f.read_text())
    return got


def served_texts(texts: dict, path: Path, max_tokens: int = 128) -> dict[str, tuple[list[int], list[int]]]:
    """``texts``' prompts with the greedy output the engine serves with the shipped recipe (OSCAR, the CPU), generated
    once into ``path``: what drafts meet under the recipe, whose text differs from the unquantized model's."""
    if not path.exists():
        from oscarkv.engine.request import SamplingParams
        from oscarkv.llm import LLM

        names = list(texts)
        with LLM("default", kv="oscar", device="cpu", dtype="float32") as llm:
            outs = llm.generate([texts[n][0] for n in names], SamplingParams(temperature=0.0, max_tokens=max_tokens))
        path.write_text(json.dumps({n: o.token_ids for n, o in zip(names, outs)}))
    got = json.loads(path.read_text())
    return {n: (texts[n][0], got[n]) for n in texts}


def paired(rows: list[dict], ref: str = "0.25") -> str:
    """Each rule against ``ref`` (the shipped floor before) per step costs and K: the geometric mean of the per-text
    speed-up ratios, a 95% bootstrap interval over the texts and how many texts lose more than 1%."""
    import random

    base = {(r["cost"], r["k"]): r["speedups"] for r in rows if r["rule"] == ref}
    lines = [f"\n| step costs | K | rule | / {ref} (95%) | texts > 1% slower |", "|---|---:|---|---|---:|"]
    for r in rows:
        b = base[r["cost"], r["k"]]
        d = [math.log(r["speedups"][n] / b[n]) for n in b]
        rng = random.Random(0)
        ms = sorted(sum(rng.choice(d) for _ in d) / len(d) for _ in range(4000))
        lines.append(f"| {r['cost']} | {r['k']} | {r['rule']} | {math.exp(sum(d) / len(d)):.3f} ({math.exp(ms[100]):.3f}"
                     f"-{math.exp(ms[3899]):.3f}) | {sum(x < -0.01 for x in d)} of {len(d)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", default="0.25,0.15,0.1,0.05,0,tokens1,tokens1.5,tokens2")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--measured", action="store_true", help="the per-K step costs of MEASURED instead of COSTS")
    ap.add_argument("--ref", default="0.25", help="the rule every other is paired against")
    ap.add_argument("--window", default="16,0,16", help="page, sink, recent of the recipe whose demotions cap drafts")
    ap.add_argument("--served", type=Path, help="a JSON of the engine's greedy outputs with the shipped recipe (made "
                    "once when absent): replay those instead of the unquantized model's")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    texts, rows = dev_set(), []
    texts = served_texts(texts, a.served) if a.served else texts
    cap = P.cap(*map(int, a.window.split(",")))
    for cname, costs in (MEASURED if a.measured else COSTS).items():
        for k in (2, 4, 8):
            cost = costs[k] if isinstance(costs, dict) else costs
            for rule in a.rules.split(","):
                got = {n: replay(p, o, k, rule, cost, cap) for n, (p, o) in texts.items()}
                rows.append(dict(cost=cname, k=k, rule=rule, speedups=got,
                                 geomean=math.exp(sum(map(math.log, got.values())) / len(got)), worst=min(got.values()),
                                 copy=math.exp(sum(math.log(v) for n, v in got.items() if "copy" in n and "no-copy" not in n)
                                               / sum(1 for n in got if "copy" in n and "no-copy" not in n))))
                print(f"{cname} K={k} {rule:9s} geomean {rows[-1]['geomean']:.3f} worst {rows[-1]['worst']:.3f} "
                      f"copy {rows[-1]['copy']:.3f}", flush=True)
    (a.out / "rules.json").write_text(json.dumps(rows, indent=1))
    lines = ["| step costs | K | rule | geometric mean | worst | copy tasks |", "|---|---:|---|---:|---:|---:|"]
    lines += [f"| {r['cost']} | {r['k']} | {r['rule']} | {r['geomean']:.3f} | {r['worst']:.3f} | {r['copy']:.3f} |" for r in rows]
    (a.out / "summary.md").write_text("\n".join(lines) + "\n" + paired(rows, a.ref))


if __name__ == "__main__":
    main()
