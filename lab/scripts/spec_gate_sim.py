"""The draft gate replayed over real greedy text, on the CPU (issue 29, development only).

``bench speculative`` on a GPU measures what speculation costs where text does not copy: each verify step or probe
breaks the run-ahead (overlap), about 3.4 ms on the default model (H200, 2026-11-27, BF16 no-copy K = 8: 6 probes,
+20 ms over 128 tokens). This replays :class:`oscarkv.engine.speculative.SpeculativeDecoder`'s gate as the engine
drives it with overlap (``drafts_next`` on the tokens the host has, one step behind; ``propose`` then ``accept``
where it may draft, ``skip`` where not) over the greedy tokens the default model generates for the bench's tasks,
and counts what each step costs: overlap breaks, verify steps, drafted and accepted tokens.

    OMP_NUM_THREADS=1 python lab/scripts/spec_gate_sim.py --document-tokens 6144 --max-tokens 128 --out runs/gate
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from oscarkv.bench.speculative import task_prompts  # noqa: E402
from oscarkv.cli.flags import load  # noqa: E402
from oscarkv.config import SpeculativeConfig  # noqa: E402
from oscarkv.engine.speculative import SpeculativeDecoder  # noqa: E402


class Seq:
    def __init__(self, ids: list[int]) -> None:
        self.token_ids = ids


def greedy(loaded, ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``ids`` (transformers' own cache: the text the gate is replayed over)."""
    import torch

    with torch.no_grad():
        out = loaded.model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


def replay(prompt: list[int], text: list[int], k: int, cfg: SpeculativeConfig | None = None, index=None,
           limit=None) -> dict:
    """The gate over ``text``: the engine's calls, one decode step at a time (with overlap). ``cfg``: the drafter's
    settings (default: ngram, K = ``k``); ``index``: its n-gram index (default: the engine's); ``limit(t)``: the most
    drafts a step to ``t`` tokens may add (``KVCacheManager.draft_end``; default: no cap)."""
    spec = SpeculativeDecoder(cfg or SpeculativeConfig("ngram", num_speculative_tokens=k))
    seq, t, steps, breaks = Seq(list(prompt)), 0, 0, 0
    if index is not None:
        spec._index[seq] = index
    while t < len(text):
        steps += 1
        seq.token_ids = prompt + text[:max(0, t - 1)]  # the host's view: the running step's token is not there yet
        if t > 0 and not spec.drafts_next(seq):
            spec.skip(seq)  # planned ahead: overlap kept
            t += 1
            continue
        breaks += 1  # this step waits for the last token on the host
        seq.token_ids = prompt + text[:t]
        room = len(text) - t - 1
        drafts = spec.propose(seq, room if limit is None else min(room, limit(len(prompt) + t + 1)))
        a = next((j for j in range(len(drafts)) if drafts[j] != text[t + j]), len(drafts))
        if drafts:
            spec.stats.verify_steps += 1
            spec.stats.drafted += len(drafts)
            spec.stats.accepted += a
            spec._gate[seq].update(len(drafts), a)
        t += a + 1
    s = spec.stats
    return dict(k=k, steps=steps, breaks=breaks, verify_steps=s.verify_steps, drafted=s.drafted, accepted=s.accepted)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--document-tokens", type=int, default=6144)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--out", type=Path, default=Path("runs/spec_gate"))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    loaded = load("default", "float32", "cpu")
    rows = []
    for task, ids in task_prompts(loaded.tokenizer, a.document_tokens).items():
        cache = a.out / f"text_{task}.json"
        text = json.loads(cache.read_text()) if cache.exists() else greedy(loaded, ids, a.max_tokens)
        cache.write_text(json.dumps(text))
        for k in (2, 4, 8):
            rows.append(dict(task=task, **replay(ids, text, k)))
            print(json.dumps(rows[-1]), flush=True)
    (a.out / "replay.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
