"""How much of a cached prompt a follow-up turn hits, with the engine's own chunking (CPU, a tiny random model).

``oscarkv bench followup`` sizes the prefill chunk to the follow-up (one chunk of k tokens), so its prefix hits in
full. A server keeps ``EngineConfig.prefill_chunk`` (512 by default): page keys hash the chunk ends that computed
each page (``oscarkv.cache.seq_kv``), and the cached prompt's last chunk ended at its own length, so a longer
prompt — the same document plus a follow-up — misses every page after the cached prompt's last multiple of the
chunk and recomputes them beside its k new tokens. This prints, per chunk size, the tokens hit and computed.

    PYTHONPATH=. python -m lab.scripts.followup_chunk_hits [--prefix 3000] [--chunks 512,1024]
"""

from __future__ import annotations

import argparse

from transformers import Qwen3Config

from oscarkv.bench import e2e, followup
from oscarkv.config import EngineConfig, KVConfig
from oscarkv.engine.request import SamplingParams
from oscarkv.models.llama import PagedLM


def hits(model: PagedLM, method: str, chunk: int, prefix_len: int, ks=(1, 8, 64)) -> list[dict]:
    cfg = EngineConfig(KVConfig(method), kv_memory_bytes=1 << 26, max_num_seqs=4, max_num_batched_tokens=chunk + 4,
                       prefill_chunk=chunk, enable_prefix_caching=True)
    engine = e2e.bench_engine(model, cfg, e2e.random_artifact(model.config) if method == "oscar" else None)
    prefix, rows = followup._ids(engine, prefix_len, 0), []
    followup.cache_prefix(engine, prefix)
    for k in ks:
        h, n = engine.manager.hit_tokens, len(engine.runner.launches)
        engine.add_request(f"f{k}", prefix + followup._ids(engine, k, k), SamplingParams(max_tokens=1, ignore_eos=True))
        e2e.drive(engine)
        computed = sum(launch.tokens for launch in engine.runner.launches[n:])
        rows.append(dict(method=method, chunk=chunk, prefix=prefix_len, k=k, hit=engine.manager.hit_tokens - h,
                         computed=computed))
    engine.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=3000)
    ap.add_argument("--chunks", default="512,1024")
    a = ap.parse_args()
    config = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, vocab_size=128, max_position_embeddings=a.prefix + 1024,
                         architectures=["Qwen3ForCausalLM"])
    model = PagedLM.random(config)
    print("| kv | prefill chunk | cached prompt | k | hit | computed |\n|---|---:|---:|---:|---:|---:|")
    for chunk in (int(c) for c in a.chunks.split(",")):
        for method in ("bf16", "oscar"):
            for r in hits(model, method, chunk, a.prefix):
                print(f"| {r['method']} | {r['chunk']} | {r['prefix']} | {r['k']} | {r['hit']} | {r['computed']} |")


if __name__ == "__main__":
    main()
