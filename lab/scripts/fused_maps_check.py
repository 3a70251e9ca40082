"""Long extend steps through the fused input maps (issue 29 diagnostic, one GPU): an OSCAR follow-up of 512 tokens
on a cached 32K prompt is host-bound (~27 ms of kernels, 51 ms of wall; BF16 36) and launches ~27 kernels a layer
more than BF16, several of them the unfused maps (QK-norm + RoPE, the query's bf16 GEMM and its two reshapes, the
key's fp32 map). ``TritonAttention.fused_extend_tokens`` (16: verify steps) bounds the chunks that take the one-launch
``qk_norm_rope_map`` instead. For each bound: follow-ups of k tokens on the cached prompt (median of the last 3 of 4,
ms, as ``bench followup --prefill-chunk 512``), a cold prompt prefilled in 512-token chunks (ms, TTFT as served),
and each follow-up's greedy token (the bounds must agree, up to near-ties).

    python -m lab.scripts.fused_maps_check --context 32768 --bounds 16,512 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from oscarkv.bench import e2e
from oscarkv.bench.followup import _ids, cache_prefix, followup_engine, followup_step
from oscarkv.engine.request import SamplingParams


def cold_prefill_ms(engine, n: int, seed: int) -> tuple[float, int]:
    """A fresh ``n``-token prompt (no prefix hit), every 512-token chunk through the model: wall ms, its token."""
    e2e.sync()
    t = time.perf_counter()
    engine.add_request(f"cold{seed}", _ids(engine, n, 1000 + seed), SamplingParams(max_tokens=1, ignore_eos=True))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    e2e.sync()
    return 1e3 * (time.perf_counter() - t), outs[-1].token_ids[-1]


def tokens_of(engine, prefix: list[int], k: int, seed: int) -> int:
    """The greedy token after the prefix and k fixed tokens."""
    engine.add_request(f"tok{k}-{seed}-{time.time()}", prefix + _ids(engine, k, 7 + seed),
                       SamplingParams(max_tokens=1, ignore_eos=True), resume=(len(prefix),))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    return outs[-1].token_ids[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--bounds", default="16,512")
    ap.add_argument("--ks", default="64,512")
    ap.add_argument("--cold", type=int, default=8192)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    model = e2e.random_model("qwen3-4b")
    engine = followup_engine(model, "oscar", 24 << 30, 512, 512)
    prefix = _ids(engine, a.context + 256, a.context)
    cache_prefix(engine, prefix)
    backend, rows = engine.runner.backend, []
    for rep in range(2):  # the bounds interleaved twice: drift between them shows
        for bound in map(int, a.bounds.split(",")):
            backend.fused_extend_tokens = bound
            row = dict(bound=bound, rep=rep)
            for k in map(int, a.ks.split(",")):
                got = [followup_step(engine, prefix, k, 100 * rep + s, False, True)["step_s"] for s in range(4)]
                row[f"k{k}_ms"] = 1e3 * statistics.median(got[1:])
                row[f"k{k}_token"] = tokens_of(engine, prefix, k, 0)
            cold = [cold_prefill_ms(engine, a.cold, 10 * rep + s + 100 * bound) for s in range(2)]
            row["cold_ms"], row["cold_tokens"] = cold[-1][0], [c[1] for c in cold]
            rows.append(row)
            print(json.dumps(row), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "fused_maps_check.json").write_text(json.dumps(dict(context=a.context, cold=a.cold, rows=rows), indent=1))


if __name__ == "__main__":
    main()
