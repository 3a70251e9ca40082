"""Piecewise graphs for steps of several sequences (``EngineConfig.piecewise_batches``, built without a GPU): a
served mix on one GPU. A request decodes (batch 1, a cached-free short prompt) while ``--prompts`` cold prompts of
``--prompt-tokens`` arrive together; the scheduler packs each step with the decoding tokens and one prompt chunk, so
without the flag every such step runs eagerly (host-bound: ~25 launches a layer) and with it through the pieces.
Per variant (one engine each, same model): each cold prompt's time to first token, the decoding request's step
times while the prompts fill (its inter-token latency under load) and after, the whole run; and the first tokens
of each request (greedy: both variants' must agree up to the padding's rounding).

    python -m lab.scripts.pieces_batch_check --prompts 2 --prompt-tokens 16384 --out DIR

On the CPU (``--shape tiny``, the tests) the same code runs at a tiny shape, nothing captured.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

from oscarkv.bench import e2e
from oscarkv.bench.followup import _ids
from oscarkv.config import EngineConfig, KVConfig
from oscarkv.engine.request import SamplingParams

CHUNK = 512


def engine_for(model, method: str, batches: bool, kv_bytes: int, buckets: tuple[int, ...] | None = None,
               chunk: int = CHUNK):
    """An engine that packs a prompt chunk beside decoding tokens, its pieces serving such steps or not."""
    cfg = EngineConfig(KVConfig(method), kv_memory_bytes=kv_bytes, max_num_seqs=8, max_num_batched_tokens=chunk + 8,
                       prefill_chunk=chunk, piecewise_graph_buckets=buckets, piecewise_batches=batches)
    return e2e.bench_engine(model, cfg, e2e.random_artifact(model.config) if method == "oscar" else None)


def served_mix(engine, prompts: int, prompt_tokens: int, decode_tokens: int, seed: int = 0) -> dict:
    """The mix on ``engine``: ms to each cold prompt's first token, the decoding request's step times (ms) while
    prompts fill and after, the whole run (s), and each request's first 4 tokens. ``seed``: another draws other
    prompts (no prefix hit on an earlier mix)."""
    greedy = dict(temperature=0, ignore_eos=True)
    engine.add_request("decode", _ids(engine, 64, 1 + seed), SamplingParams(max_tokens=decode_tokens, **greedy))
    for _ in range(4):  # it decodes before the prompts arrive
        engine.step()
    e2e.sync()
    t0 = time.perf_counter()
    for i in range(prompts):
        engine.add_request(f"p{i}", _ids(engine, prompt_tokens, 10 + i + seed), SamplingParams(max_tokens=4, **greedy))
    first, tokens, filling, after, last = {}, {}, [], [], t0
    while engine.has_unfinished():
        outs = engine.step()
        e2e.sync()
        now = time.perf_counter()
        for o in outs:
            if o.request_id != "decode" and o.request_id not in first and o.token_ids:
                first[o.request_id] = 1e3 * (now - t0)
            if o.request_id == "decode" and o.new_token_ids:
                (filling if len(first) < prompts else after).append(1e3 * (now - last))
            tokens[o.request_id] = list(o.token_ids[:4])
        last = now
    return dict(ttft_ms=[first[f"p{i}"] for i in range(prompts)], decode_step_ms_filling=_median(filling),
                decode_step_ms_after=_median(after), run_s=time.perf_counter() - t0, tokens=tokens)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=16384)
    ap.add_argument("--decode-tokens", type=int, default=512)
    ap.add_argument("--methods", default="bf16,oscar")
    ap.add_argument("--shape", default="qwen3-4b")
    ap.add_argument("--kv-gib", type=float, default=24.0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    model, rows = e2e.random_model(a.shape), []
    for method in a.methods.split(","):
        for batches in (False, True):
            engine = engine_for(copy.deepcopy(model), method, batches, int(a.kv_gib * 2**30))  # NOTE: OSCAR folds
            # its value maps into the model it is given: two engines of one model would not run the same model
            try:  # warm-up (untimed): kernels compiled and tuned before either variant is timed (the first run of
                # 2026-11-28 timed compilation into the variant measured first: TTFT 4.4 s against 1.9)
                served_mix(engine, 1, 2 * CHUNK + 64, 16, seed=500)
                if pw := getattr(engine.runner.inner, "piecewise", None):  # count the timed mix's steps alone
                    pw.replays = pw.batched = 0
                    pw.fallbacks.clear()
                row = dict(method=method, batches=batches, **served_mix(engine, a.prompts, a.prompt_tokens,
                                                                         a.decode_tokens))
                row["pieces"] = dict(replays=pw.replays, batched=pw.batched, fallbacks=dict(pw.fallbacks)) if pw else None
                rows.append(row)
            finally:
                engine.close()
                del engine
                e2e.release()
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "tokens"}), flush=True)
        off, on = rows[-2], rows[-1]
        print(f"== {method}: first tokens equal {off['tokens'] == on['tokens']}; TTFT ms {off['ttft_ms']} -> "
              f"{on['ttft_ms']}; decode step while filling {off['decode_step_ms_filling']} -> "
              f"{on['decode_step_ms_filling']} ms", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "pieces_batch_check.json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(),
                                                                   rows=rows), indent=1))


if __name__ == "__main__":
    main()
