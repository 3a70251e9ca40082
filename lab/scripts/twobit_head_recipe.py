"""A per-head key allocation recipe (issue 26) from the development head sensitivities, sized to a budget.

    python lab/scripts/twobit_head_recipe.py --context 8192 [--heads N] [--sink S --recent R --page P] --out lab/scripts/twobit_recipe_8192_heads.json

Heads are ranked by their development gain (teacher-forced answer NLL when that head alone stores 4-bit keys,
seeds 1000/1001: ``lab/results/dev_twobit_8k_heads/sens_*.jsonl``, ``twobit_heads.py sens``); the recipe takes the
``N`` most sensitive (``--heads``; default: the most that keep the codec's bits per element at ``--context`` within
INT2+win's, the uniform recipe's with its windows: the budget of issue 26), sink 64 / recent 64 (the shipped
windows; ``--sink``/``--recent`` trade them for heads; the engine serves a sink of whole pages, ``--page``), values and every other head at 2 bits, the uniform INT2 recipe's key clip. The ranking and the budget
come from development data only; nothing here reads an evaluation sample.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lab.scripts.twobit_artifacts import SHIPPED, budget  # noqa: E402
from lab.scripts.twobit_heads import ranked_heads  # noqa: E402
from oscarkv.calibrate.default import frontier_artifacts  # noqa: E402
from oscarkv.config import KVConfig  # noqa: E402
from oscarkv.quant.artifact import Artifact, apply_recipe  # noqa: E402
from oscarkv.quant.codec import build_codec  # noqa: E402



def recipe_for(ranked: list[tuple[int, int]], n: int, base: KVConfig, art: Artifact) -> tuple[KVConfig, dict]:
    layers = art.fingerprint.num_layers
    heads = [sorted(h for li, h in ranked[:n] if li == i) for i in range(layers)]
    kv = replace(base, layer_key_heads=tuple(map(tuple, heads)))
    return kv, {"layer_key_heads": heads}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--sink", type=int, default=64)
    p.add_argument("--recent", type=int, default=64)
    p.add_argument("--page", type=int, default=64)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    art = frontier_artifacts(Artifact.load(SHIPPED))["int2"]
    base = replace(apply_recipe(KVConfig(group_size=art.manifest["group_size"]), art), sink=a.sink, recent=a.recent, page_size=a.page)
    ranked = ranked_heads()
    limit = budget(a.context)

    def bpe(n: int) -> float:
        return build_codec(recipe_for(ranked, n, base, art)[0], *art.fingerprint.kv_dims, art).bpe(a.context)
    n = a.heads if a.heads is not None else max(k for k in range(len(ranked) + 1) if bpe(k) <= limit)
    kv, fields = recipe_for(ranked, n, base, art)
    codec = build_codec(kv, *art.fingerprint.kv_dims, art)
    rec = {k: v for k, v in art.manifest["recipe"].items() if k not in ("candidates", "tolerance", "bf16")}
    rec |= {"sink": a.sink, "recent": a.recent, "page_size": a.page, **fields, "bpe": round(codec.bpe(a.context), 4), "context": a.context,
            "max_bpe": round(limit, 4), "objective": (
                f"the {n} KV heads (of {art.fingerprint.num_layers * art.fingerprint.num_kv_heads}) whose 4-bit keys gain most development answer NLL alone "
                "(teacher-forced, 8192 tokens, seeds 1000/1001: lab/results/dev_twobit_8k_heads/), within INT2+win's "
                f"bits per element at {a.context} tokens ({limit:.4f}); lab/scripts/twobit_head_recipe.py"),
            "dev_context": 8192, "dev_samples": 8, "dev_seeds": [1000, 1001], "haystack": "calibration",
            "protocol": "forced"}
    a.out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"{n} heads: {', '.join(f'{codec.bpe(t):.4f}' for t in (4096, 8192, 102400))} BPE at 4K / 8K / 100K "
          f"(budget {limit:.4f} at {a.context}) -> {a.out}")


if __name__ == "__main__":
    main()
