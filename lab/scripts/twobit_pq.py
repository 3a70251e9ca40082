"""Vector-quantized keys on the development objective at 8K (issue 26, development only): do gain-shape product
codes earn their kernels, beside per-head 4-bit keys?

A key's rotated, centred vector (the shipped artifact's codec domain, BF16-rounded as the cache stores it) is
stored as its norm (fp16) and, per 4-dimensional sub-vector of its direction, the index of the nearest of 256
centroids: ``d/4`` bytes + 2, i.e. 2.25 bits per element at d = 64 (INT2 with its fp16 scale and zero costs 2.5).
Codebooks per (layer, KV head, sub-space), k-means (``--iters``) on the calibration text's keys at every position of
``--fit-context``-token windows (the positions the cache serves: a codebook fitted on short windows misses the
long-range keys, the issue's prototype found). Fake quantization (:class:`GainShape`), not served.

Scored like ``twobit_heads.py eval`` (teacher-forced answer NLL on development samples, seeds 1006/1007, values at
INT2, sink 64 / recent 64), paired against the shipped recipe (4-bit keys in 28 heads): INT2 keys everywhere, PQ keys
everywhere, and PQ keys with 4-bit keys in as many top heads as fit INT2+win's bytes (3.0273 BPE at 8K).

    OMP_NUM_THREADS=2 python lab/scripts/twobit_pq.py fit --out DIR            # codebooks.safetensors
    OMP_NUM_THREADS=1 python lab/scripts/twobit_pq.py eval --seeds 1006 --out DIR &
    OMP_NUM_THREADS=1 python lab/scripts/twobit_pq.py eval --seeds 1007 --out DIR &
    wait; python lab/scripts/twobit_pq.py combine --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lab.scripts.twobit_artifacts import SHIPPED, budget  # noqa: E402
from lab.scripts.twobit_heads import logged_scores, ranked_heads  # noqa: E402
from oscarkv.calibrate.default import frontier_artifacts  # noqa: E402
from oscarkv.cli.flags import load  # noqa: E402
from oscarkv.config import KVConfig  # noqa: E402
from oscarkv.eval.paired import difference  # noqa: E402
from oscarkv.eval.runner import prefill  # noqa: E402
from oscarkv.quant.artifact import Artifact, apply_recipe  # noqa: E402
from oscarkv.quant.codec import KVCodec, LayerCodec, TensorCodec, build_codec  # noqa: E402

SUB, K = 4, 256


@dataclass(frozen=True)
class GainShape(TensorCodec):
    """Keys as norm × product-quantized direction (``book [H, d/SUB, K, SUB]``); heads in ``high`` at 4 bits instead
    (``four``: the layer's 4-bit codec)."""

    book: torch.Tensor | None = None
    four: TensorCodec | None = None
    high: tuple[int, ...] = field(default=())

    def encode(self, x_rot: torch.Tensor):
        x = x_rot.float()
        g = x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        s = (x / g).view(*x.shape[:2], -1, SUB)  # [T, H, M, SUB]
        H, M = self.book.shape[:2]
        idx = torch.stack([torch.stack([torch.cdist(s[:, h, m], self.book[h, m]).argmin(-1) for m in range(M)], -1)
                           for h in range(H)], 1)  # [T, H, M]
        return g.half(), idx, (self.four.encode(x_rot[:, list(self.high)]) if self.high else None)

    def decode(self, p) -> torch.Tensor:
        g, idx, hi = p
        H, M = self.book.shape[:2]
        dirs = self.book[torch.arange(H)[None, :, None], torch.arange(M)[None, None, :], idx]  # [T, H, M, SUB]
        out = g.float() * dirs.flatten(-2)
        if self.high:
            out[:, list(self.high)] = self.four.decode(hi)
        return out

    def bpe(self, n_low: int, n_bf16: int, page: int) -> float:
        h, d = self.book.shape[0], self.book.shape[1] * SUB
        pq = (n_low * (8 / SUB + 16 / d) + 16 * n_bf16) / max(1, n_low + n_bf16)  # an index byte per SUB, an fp16 norm
        four = self.four.bpe(n_low, n_bf16, page)
        return ((h - len(self.high)) * pq + len(self.high) * four) / h


def fit(out: Path, context: int, iters: int) -> None:
    """k-means codebooks from the calibration text's keys, every position of ``context``-token windows."""
    loaded = load("default", "float32", "cpu")
    art = frontier_artifacts(Artifact.load(SHIPPED))["int2"]
    codec = build_codec(apply_recipe(KVConfig(group_size=art.manifest["group_size"]), art), *art.fingerprint.kv_dims, art)
    ids = loaded.tokenizer(Path("oscarkv/data/calibration.txt").read_text(), return_tensors="pt").input_ids[0]
    keys: list[list[torch.Tensor]] = [[] for _ in codec.layers]
    for w0 in range(0, len(ids) - context + 1, context):
        doc = prefill(loaded.model, ids[None, w0:w0 + context])
        for i, layer in enumerate(codec.layers):
            k = doc.layers[i].keys[0].transpose(0, 1)  # [T, H, d]
            keys[i].append(layer.key.to_rotated(k).bfloat16().float())
        print(f"  window at {w0}: keys captured", flush=True)
    books = {}
    g = torch.Generator().manual_seed(0)
    for i, ks in enumerate(keys):
        x = torch.cat(ks)  # [N, H, d]
        s = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        books[f"layer{i}"] = torch.stack([torch.stack([kmeans(s[:, h, m * SUB:(m + 1) * SUB], iters, g)
                                                       for m in range(s.shape[2] // SUB)]) for h in range(s.shape[1])])
        print(f"  layer {i}: {x.shape[0]} keys a head, codebooks fitted", flush=True)
    save_file(books, str(out / "codebooks.safetensors"))


def kmeans(x: torch.Tensor, iters: int, g: torch.Generator) -> torch.Tensor:
    """``K`` centroids of ``x [N, SUB]`` (Lloyd, k-means++-free: a random sample to start; empty ones re-seeded)."""
    c = x[torch.randperm(x.shape[0], generator=g)[:K]].clone()
    for _ in range(iters):
        a = torch.cdist(x, c).argmin(1)
        sums = torch.zeros_like(c).index_add_(0, a, x)
        n = torch.bincount(a, minlength=K).float()
        empty = n == 0
        c = torch.where(empty[:, None], x[torch.randint(0, x.shape[0], (K,), generator=g)], sums / n.clamp_min(1)[:, None])
    return c


def codecs(out: Path) -> dict[str, KVCodec]:
    art = frontier_artifacts(Artifact.load(SHIPPED))["int2"]
    dims = art.fingerprint.kv_dims
    base = replace(apply_recipe(KVConfig(group_size=art.manifest["group_size"]), art), sink=64, recent=64)
    books = load_file(str(out / "codebooks.safetensors"))
    ranked = ranked_heads()
    shipped = json.loads(Path("oscarkv/data/default_recipe.json").read_text())["recipe"]["layer_key_heads"]
    int2 = build_codec(base, *dims, art)
    k4 = build_codec(replace(base, key_bits=4), *dims, art)

    def pq(n: int) -> KVCodec:
        top = set(ranked[:n])
        layers = tuple(LayerCodec(GainShape(**{f: getattr(x.key, f) for f in TensorCodec.__dataclass_fields__},
                                            book=books[f"layer{i}"], four=k4.layers[i].key,
                                            high=tuple(sorted(h for li, h in top if li == i))), x.value)
                       for i, x in enumerate(int2.layers))
        return replace(int2, layers=layers)
    limit = budget(8192)
    n = max(k for k in range(len(ranked) + 1) if pq(k).bpe(8192) <= limit)
    return {"shipped: 28 heads": build_codec(replace(base, layer_key_heads=tuple(map(tuple, shipped))), *dims, art),
            "INT2 keys": int2, "PQ keys": pq(0), f"PQ keys + {n} heads": pq(n)}


def evaluate(out: Path, seeds: str, n: int) -> None:
    loaded = load("default", "float32", "cpu")
    cs = codecs(out)
    logged_scores(loaded, cs, tuple(int(s) for s in seeds.split(",")), n, out / f"scores_{seeds.replace(',', '_')}.jsonl",
                  extra={"bpe": {k: round(c.bpe(8192), 4) for k, c in cs.items()}})


def combine(out: Path) -> None:
    rows = [json.loads(line) for f in sorted(out.glob("scores_*.jsonl")) for line in f.read_text().splitlines()]
    labels = list(rows[0]["nll"])
    base = [r["nll"][labels[0]] for r in rows]
    summary = {}
    for label in labels:
        mine = [r["nll"][label] for r in rows]
        d, se = difference(mine, base)
        summary[label] = {"bpe_8k": rows[0]["bpe"][label], "nll": sum(mine) / len(mine), "vs_shipped": d, "stderr": se,
                          "found": sum(r["accuracy"][label] for r in rows) / len(rows), "samples": len(rows)}
        print(f"{label:<22} BPE {rows[0]['bpe'][label]:.4f}  NLL {summary[label]['nll']:.3f}  vs shipped {d:+.3f} ± {se:.3f}")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("fit", "eval", "combine"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--fit-context", type=int, default=8192)
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--seeds", default="1006")
    p.add_argument("--samples", type=int, default=6)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.mode == "fit":
        fit(a.out, a.fit_context, a.iters)
    elif a.mode == "eval":
        evaluate(a.out, a.seeds, a.samples)
    else:
        combine(a.out)


if __name__ == "__main__":
    main()
