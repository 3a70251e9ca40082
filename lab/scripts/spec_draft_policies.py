"""Draft policies replayed over development text, on the CPU (issue 29, development only; lab code).

``bench speculative``'s copy task gains 2.7 tokens per step at K = 8 (H200, 2026-11-27) although 71% of drafts are
accepted: most steps draft little or nothing. This replays the engine's drafter and gate, as the engine drives them
with overlap (as ``spec_gate_sim.py`` does), over the default model's greedy text for the bench's two tasks on
*development* documents: slices of ``calibration.txt`` (prose) and gazetteers generated with other seeds than the
shipped one (templated prose, as the bench's document is). The bench's own document is the evaluation: no policy is
chosen on it. Each decode step's drafts are capped as ``KVCacheManager.draft_end`` caps them (no draft makes a
demotion: with the shipped recipe's pages of 16 a step verifies at most the tokens left before the next page
boundary), or not (``cap=none``: what drafts across a demotion would gain).

Policies (``NgramIndex`` variants): ``last`` the engine's (the longest suffix of 1-4 tokens, its last earlier
occurrence); ``follow`` among occurrences of the longest suffix, the one that continues the source of the step before
(when it still matches), else ``last``; ``min2`` / ``min3`` suffixes of at least 2 / 3 tokens; ``max8`` up to 8.
Modelled ms per token = (steps x 1.32 + overlap breaks x 2.0) / tokens (OSCAR's plain decode on an H200 and the cost
of a break, as ``spec_gate_policies.py``): a guide for ranking, not a measurement.

    OMP_NUM_THREADS=1 python lab/scripts/spec_draft_policies.py --out lab/results/spec_draft_policies
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_prose_haystack import gazetteer  # noqa: E402
from spec_gate_sim import greedy, replay  # noqa: E402

from oscarkv.bench.speculative import TASKS  # noqa: E402
from oscarkv.cli.flags import load  # noqa: E402
from oscarkv.config import SpeculativeConfig  # noqa: E402
from oscarkv.data import read_text  # noqa: E402
from oscarkv.engine import speculative as S  # noqa: E402
from oscarkv.quant.bpe import history_end  # noqa: E402

DEV_SEEDS = ("oscarkv gazetteer dev 1", "oscarkv gazetteer dev 2", "oscarkv gazetteer dev 3")
STEP_MS, BREAK_MS = 1.32, 2.0


def slices(tokenizer, text: str, n: int, count: int) -> list[str]:
    """Up to ``count`` consecutive slices of ``text`` of at most ``n`` tokens each, cut at line ends."""
    out, lines, used = [], [], 0
    for line in text.splitlines(keepends=True):
        m = len(tokenizer.encode(line, add_special_tokens=False))
        if used + m > n:
            out.append("".join(lines))
            lines, used = [], 0
            if len(out) == count:
                return out
        lines.append(line)
        used += m
    return out


def dev_documents(tokenizer, n: int, prose: int) -> dict[str, str]:
    """Development documents: ``prose`` slices of the calibration text, the first ``n`` tokens of each dev gazetteer."""
    docs = {f"prose{i}": d for i, d in enumerate(slices(tokenizer, read_text("calibration.txt"), n, prose))}
    docs.update({f"gaz{i}": slices(tokenizer, gazetteer(seed), n, 1)[0] for i, seed in enumerate(DEV_SEEDS)})
    return docs


def prompt_ids(tokenizer, doc: str, ask: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": f"{doc}\n{ask}"}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


class Follow(S.NgramIndex):
    """Among the occurrences of the longest matching suffix, the one continuing the last proposal's source."""

    src: tuple[int, int] | None = None

    def propose(self, tokens: list[int], k: int) -> list[int]:
        L = len(tokens)
        if self.src is not None:
            e = self.src[0] + L - self.src[1]
            m = min(self.hi, L - 1)
            if m <= e < L and tokens[e - m:e] == tokens[L - m:]:
                self.src = (e, L)
                return tokens[e:e + k]
        e = self.match(tokens)
        self.src = None if e is None else (e, L)
        return [] if e is None else tokens[e:e + k]


POLICIES = {"last": (S.NgramIndex, 1, 4), "follow": (Follow, 1, 4), "min2": (S.NgramIndex, 2, 4),
            "min3": (S.NgramIndex, 3, 4), "max8": (S.NgramIndex, 1, 8), "follow_max8": (Follow, 1, 8),
            "follow_min2": (Follow, 2, 4)}


def cap(page: int, sink: int, recent: int):
    """``limit(t)``: drafts a step to ``t`` tokens may add without making a demotion (``draft_end``)."""
    def limit(t: int) -> int:
        h, d = history_end(t, sink, recent, page), 0
        while history_end(t + d + 1, sink, recent, page) == h and d < 64:
            d += 1
        return d
    return limit


def run(prompt: list[int], text: list[int], k: int, policy: str, limit) -> dict:
    """``spec_gate_sim.replay`` with ``policy``'s index and settings, drafts capped by ``limit``."""
    kind, lo, hi = POLICIES[policy]
    cfg = SpeculativeConfig("ngram", num_speculative_tokens=k, prompt_lookup_min=lo, prompt_lookup_max=hi)
    r = replay(prompt, text, k, cfg, kind(lo, hi), limit)
    return dict(r, policy=policy, tokens=len(text), tokens_per_step=len(text) / r["steps"],
                model_ms=(r["steps"] * STEP_MS + r["breaks"] * BREAK_MS) / len(text))


def texts(loaded, docs: dict[str, str], max_tokens: int, out: Path) -> dict[tuple[str, str], tuple[list, list]]:
    """(document, task) -> (prompt ids, greedy text), generated once and kept under ``out``."""
    got = {}
    for name, doc in docs.items():
        for task, ask in TASKS.items():
            ids, cache = prompt_ids(loaded.tokenizer, doc, ask), out / f"text_{name}_{task}.json"
            text = json.loads(cache.read_text()) if cache.exists() else greedy(loaded, ids, max_tokens)
            cache.write_text(json.dumps(text))
            got[name, task] = ids, text
            print(f"{name} {task}: {len(ids)} prompt tokens", flush=True)
    return got


def summary(rows: list[dict]) -> str:
    """Per task, cap, K and policy: summed tokens / steps and the modelled ms per token (all documents)."""
    agg: dict[tuple, list[int]] = {}
    for r in rows:
        a = agg.setdefault((r["task"], r["cap"], r["k"], r["policy"]), [0, 0, 0, 0, 0])
        for i, f in enumerate(("tokens", "steps", "breaks", "drafted", "accepted")):
            a[i] += r[f]
    lines = ["| task | cap | K | policy | tokens/step | acceptance | modelled ms/token |", "|---|---|---:|---|---:|---:|---:|"]
    for (task, c, k, pol), (tok, st, br, dr, ac) in sorted(agg.items()):
        lines.append(f"| {task} | {c} | {k} | {pol} | {tok / st:.2f} | {ac / max(dr, 1):.2f} | "
                     f"{(st * STEP_MS + br * BREAK_MS) / tok:.3f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--document-tokens", type=int, default=6144)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prose", type=int, default=4, help="slices of calibration.txt")
    p.add_argument("--only", default="", help="comma-separated document names (generation split over processes)")
    p.add_argument("--out", type=Path, default=Path("runs/spec_draft_policies"))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    loaded = load("default", "float32", "cpu")
    docs = dev_documents(loaded.tokenizer, a.document_tokens, a.prose)
    if a.only:
        docs = {n: docs[n] for n in a.only.split(",")}
    rows = []
    caps = {"page16": cap(16, 0, 16), "page64": cap(64, 64, 64), "none": None}
    for (name, task), (ids, text) in texts(loaded, docs, a.max_tokens, a.out).items():
        for c, limit in caps.items():
            for k in (4, 8):
                for policy in POLICIES:
                    rows.append(dict(doc=name, task=task, cap=c, **run(ids, text, k, policy, limit)))
    if not a.only:
        (a.out / "replay.json").write_text(json.dumps(rows, indent=1))
        table = summary(rows)
        (a.out / "summary.md").write_text(table + "\n")
        print(table)


if __name__ == "__main__":
    main()
