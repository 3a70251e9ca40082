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
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    texts, rows = dev_set(), []
    cap = P.cap(16, 0, 16)
    for cname, cost in COSTS.items():
        for k in (2, 4, 8):
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
    (a.out / "summary.md").write_text("\n".join(lines) + "\n" + paired(rows))


if __name__ == "__main__":
    main()
