"""Decode-faithful perplexity and KL against the unquantized cache for every rung of the precision ladder.

One teacher-forced pass per (text window, configuration) in which every position attends to the
history as token-by-token decoding stores it (``oscarkv.eval.faithful``), on non-overlapping windows of
``eval.txt`` (``oscarkv.eval.perplexity_data``; never the calibration text). Per configuration: the
token-mean NLL (perplexity = exp), and the token-mean KL(p_ref ‖ p) of the next-token distribution
against the unquantized cache's on the same positions, with BPE at the window length. Every
configuration uses the same windows (``--sink``/``--recent``, the engine's defaults) and the default
model's shipped artifact. Writes one JSON file (``--out``)::

    python lab/scripts/ladder_faithful.py --context 2048 --windows 4 --out lab/results/ladder_faithful.json

``--levels`` adds OSCAR INT2 with the artifact's Lloyd-Max level tables (``KVConfig.levels``, label ``oscar-lm``);
``--only LABELS`` keeps the unquantized reference and those configurations (labels as printed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from oscarkv.calibrate.default import artifact_for
from oscarkv.config import KVConfig
from oscarkv.eval.faithful import faithful_logits
from oscarkv.eval.perplexity_data import text_windows
from oscarkv.models.loader import load_model
from oscarkv.quant.codec import build_codec

CONFIGS = (("bf16", 2, 2), ("int4", 2, 2), ("oscar", 4, 4), ("oscar", 4, 2), ("oscar", 2, 4), ("oscar", 2, 2),
           ("kivi", 2, 2), ("quarot", 2, 2), ("naive", 2, 2))
"""(method, key bits, value bits): unquantized, 4-bit without rotation, the OSCAR ladder, the INT2 baselines."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--context", type=int, default=2048, help="tokens per text window")
    p.add_argument("--windows", type=int, default=4, help="text windows")
    p.add_argument("--sink", type=int, default=KVConfig().sink)
    p.add_argument("--recent", type=int, default=KVConfig().recent)
    p.add_argument("--no-windows", action="store_true", help="no BF16 sink or recent window (every past token low-bit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--levels", action="store_true", help="add OSCAR INT2 with the artifact's Lloyd-Max level tables")
    p.add_argument("--only", default=None, help="comma-separated labels to keep beside bf16 (default: all)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    torch.set_grad_enabled(False)
    loaded = load_model("default", "float32")
    c = loaded.config
    dims = (c.num_hidden_layers, c.num_key_value_heads, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    art = artifact_for(loaded, "oscar", None)
    codecs = {}
    for method, kb, vb, levels in [(*c, "uniform") for c in CONFIGS] + ([("oscar", 2, 2, "lloyd_max")] if args.levels else []):
        kv = KVConfig(method, args.sink, args.recent, key_bits=kb, value_bits=vb, levels=levels)
        kv = kv.without_windows() if args.no_windows and method != "bf16" else kv
        if method == "bf16" or args.only is None or kv.label() in args.only.split(","):
            codecs[kv.label()] = build_codec(kv, *dims, art if method == "oscar" else None)
    sums = {k: {"nll": 0.0, "kl": 0.0} for k in codecs}
    tokens, t0 = 0, time.time()
    for i, window in enumerate(text_windows(loaded.tokenizer, args.context, args.windows, args.seed)):
        ids = window.view(1, -1)
        ref = None
        for label, codec in codecs.items():  # bf16 first: the reference distribution
            logp = torch.log_softmax(faithful_logits(loaded.model, ids, codec)[0, :-1].float(), -1)  # [T - 1, V]
            ref = logp if ref is None else ref
            sums[label]["nll"] += float(-logp.gather(1, ids[0, 1:, None]).sum())
            sums[label]["kl"] += float((ref.exp() * (ref - logp)).sum())
        tokens += ids.shape[1] - 1
        print(f"window {i + 1}/{args.windows} done, {time.time() - t0:.0f} s", flush=True)
    rows = {k: {"perplexity": round(float(torch.tensor(v["nll"] / tokens).exp()), 4), "nll": round(v["nll"] / tokens, 5),
                "kl": round(v["kl"] / tokens, 5), "bpe": round(codecs[k].bpe(args.context) if codecs[k].quantized
                                                                else 32.0, 3)} for k, v in sums.items()}
    flags = [f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in vars(args).items()
             if v is not False and v is not None]
    out = {"command": "python lab/scripts/ladder_faithful.py " + " ".join(flags), "model": "default (fp32)",
           "windows": args.windows, "context": args.context, "tokens_scored": tokens, "seconds": round(time.time() - t0),
           "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for k, r in rows.items():
        print(f"{k:>18s}  ppl {r['perplexity']:8.3f}  KL {r['kl']:.5f}  BPE {r['bpe']:.2f}")


if __name__ == "__main__":
    main()
