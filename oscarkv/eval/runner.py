"""The accuracy harness behind ``oscarkv eval`` and ``oscarkv demo``.

Two measurements per KV configuration (a :class:`~oscarkv.config.KVConfig`, with and without
BF16 windows):

* **Synthetic retrieval (RULER-style, ``oscarkv.eval.tasks``).** The document is prefilled
  once per sample — prefill attention inside a chunk is full precision, so the document's
  K/V are the same for every method — then, per method, those K/V are written into an
  :class:`~oscarkv.cache.hf_cache.OscarCache` exactly as a prefill would store them, and the
  question is run as the next chunk against the cache *as stored*. Scoring is teacher-forced
  greedy match: an answer counts when every one of its tokens is the argmax given the gold
  prefix, which for the first answer is exactly "greedy decoding starts with the answer".
  Multi-answer tasks score the fraction of answers matched (RULER's partial credit).
* **Decode-faithful perplexity (``oscarkv.eval.faithful``)** on natural text windows.

Records (one per method × task × context) go to ``oscarkv.eval.report``.
"""

from __future__ import annotations

import json
import math
import time
from typing import TextIO

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from oscarkv.cache.hf_cache import TIERS, OscarCache
from oscarkv.config import EvalConfig, KVConfig
from oscarkv.eval import tasks as task_lib
from oscarkv.eval.samples import answer_spans, task_samples
from oscarkv.eval.faithful import faithful_logits
from oscarkv.eval.perplexity_data import max_windows, text_windows
from oscarkv.quant.codec import KVCodec, build_codec


def kv_configs(cfg: EvalConfig) -> list[KVConfig]:
    """Every KV configuration the evaluation runs, BF16 once."""
    out = []
    for m in cfg.methods:
        base = KVConfig(m, cfg.kv.sink, cfg.kv.recent, cfg.kv.page_size, cfg.kv.group_size)
        if m == "bf16":
            out.append(base)
            continue
        out += [base if w else base.without_windows() for w in cfg.windows]
    return out


def build_codecs(model, cfg: EvalConfig, artifacts: dict[str, object] | None = None) -> dict[str, KVCodec]:
    """One codec per report label. ``artifacts`` maps a variant name to an OSCAR artifact;
    the unnamed variant ``""`` is reported as ``oscar``, others as ``oscar:NAME``."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    dims = (c.num_hidden_layers, c.num_key_value_heads, head_dim)
    out = {}
    for kv in kv_configs(cfg):
        variants = (artifacts or {"": None}) if kv.method == "oscar" else {"": None}
        for name, art in variants.items():
            label = kv.label().replace("oscar", f"oscar:{name}", 1) if name else kv.label()
            out[label] = build_codec(kv, *dims, art)
    return out


@torch.inference_mode()
def prefill(model, ids: torch.Tensor) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)  # only the K/V are needed
    return cache


@torch.inference_mode()
def score_sample(model, doc: DynamicCache, codec: KVCodec, q_ids: torch.Tensor, target: torch.Tensor,
                 spans: list[tuple[int, int]]) -> tuple[float, float, OscarCache]:
    """Fraction of answer spans (token index ranges in ``target``) predicted exactly, and the
    mean negative log-likelihood of the answer tokens (a continuous score for small studies)."""
    cache = OscarCache.from_codec(codec)
    for i, layer in enumerate(doc.layers):
        cache.update(layer.keys, layer.values, i)
    start = doc.get_seq_length()
    ids = torch.cat([q_ids, target[:, :-1]], dim=1)
    pos = torch.arange(start, start + ids.shape[1]).unsqueeze(0)
    logits = model(ids, past_key_values=cache, position_ids=pos, use_cache=True).logits
    answer_logits = logits[0, q_ids.shape[1] - 1:].float()
    ok = answer_logits.argmax(-1) == target[0]
    nll = torch.nn.functional.cross_entropy(answer_logits, target[0], reduction="none")
    answer_nll = float(torch.cat([nll[a:b] for a, b in spans]).mean())
    return sum(bool(ok[a:b].all()) for a, b in spans) / len(spans), answer_nll, cache


class Tally:
    """Running sums per (label, task, context) → records; every sample is also logged as a
    JSON line as soon as it is scored, so an interrupted run loses nothing."""

    def __init__(self, log: TextIO | None = None) -> None:
        self.sums: dict[tuple[str, str, int], list[float]] = {}
        self.nll: dict[tuple[str, str, int], list[float]] = {}  # answer NLLs, where measured
        self.log = log

    def add(self, key: tuple[str, str, int], value: float, bpe: float, kv_bytes: int | None = None,
            answer_nll: float | None = None) -> None:
        if self.log is not None:
            row = {"method": key[0], "task": key[1], "context": key[2], "value": value, "bpe": bpe,
                   "kv_bytes": kv_bytes}
            if answer_nll is not None:
                row["answer_nll"] = answer_nll
            self.log.write(json.dumps(row) + "\n")
            self.log.flush()
        if answer_nll is not None:
            self.nll.setdefault(key, []).append(answer_nll)
        s = self.sums.setdefault(key, [0.0, 0, 0.0, 0])
        s[0] += value
        s[1] += 1
        s[2] += bpe
        s[3] += kv_bytes or 0

    def records(self, metric: str) -> list[dict]:
        out = []
        for (label, task, ctx), (total, n, bpe, nbytes) in self.sums.items():
            rec = {"method": label, "task": task, "context": ctx, "samples": n, "bpe": round(bpe / n, 4)}
            rec[metric] = math.exp(total / n) if metric == "perplexity" else total / n
            if nbytes:
                rec["kv_bytes"] = nbytes // n
            if key_nll := self.nll.get((label, task, ctx)):
                rec["answer_nll"] = round(sum(key_nll) / len(key_nll), 4)
            out.append(rec)
        return out


def records_from_log(lines) -> list[dict]:
    """Rebuild the records of a run from its per-sample JSON lines (an interrupted run included).

    ``ppl`` lines hold a token-mean negative log-likelihood, the others an accuracy."""
    tallies = {"accuracy": Tally(), "perplexity": Tally()}
    for line in lines:
        if line.strip():
            row = json.loads(line)
            metric = "perplexity" if row["task"] == "ppl" else "accuracy"
            tallies[metric].add((row["method"], row["task"], row["context"]), row["value"], row["bpe"],
                                row.get("kv_bytes"), row.get("answer_nll"))
    return [rec for metric, tally in tallies.items() for rec in tally.records(metric)]


def run_tasks(loaded, codecs: dict[str, KVCodec], cfg: EvalConfig, bar: tqdm, tally: Tally) -> list[dict]:
    model, tok = loaded.model, loaded.tokenizer
    for ctx in cfg.contexts:
        for task in (t for t in cfg.tasks if t != "ppl"):
            for sample in task_samples(loaded, task, ctx, cfg):
                doc_ids = tok(sample.document, add_special_tokens=False, return_tensors="pt").input_ids
                q_ids = tok(sample.question, add_special_tokens=False, return_tensors="pt").input_ids
                target, spans = answer_spans(tok, task_lib.answer_target(sample), sample.answers)
                doc = prefill(model, doc_ids)
                for label, codec in codecs.items():
                    acc, nll, cache = score_sample(model, doc, codec, q_ids, target, spans)
                    # measured from the bytes the cache holds (document + question + answer)
                    held = sum(v for k, v in cache.memory_bytes().items() if k in TIERS)
                    tally.add((label, task, ctx), acc, cache.bpe(), held, nll)
                bar.update(len(codecs))
    return tally.records("accuracy")


def run_perplexity(loaded, codecs: dict[str, KVCodec], cfg: EvalConfig, bar: tqdm, tally: Tally) -> list[dict]:
    for ctx in cfg.contexts:
        n = min(cfg.samples, max_windows(loaded.tokenizer, ctx))  # the text holds only so many windows
        for window in text_windows(loaded.tokenizer, ctx, n, seed=cfg.seed):
            ids = window.view(1, -1)
            for label, codec in codecs.items():
                logits = faithful_logits(loaded.model, ids, codec).float()
                nll = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
                tally.add((label, "ppl", ctx), float(nll), codec.bpe(ctx))
                bar.update(1)
    return tally.records("perplexity")


def evaluate(loaded, cfg: EvalConfig, artifacts: dict[str, object] | None = None,
             sample_log: TextIO | None = None, backend: str = "hf") -> tuple[list[dict], dict]:
    """Run every configured measurement; returns (records, meta). Per-sample scores are
    written to ``sample_log`` (JSON lines) as they are measured. ``backend="engine"`` scores
    the synthetic tasks on the paged engine (``oscarkv.eval.engine_backend``)."""
    codecs = build_codecs(loaded.model, cfg, artifacts)
    n_tasks = sum(t != "ppl" for t in cfg.tasks)
    total = len(cfg.contexts) * cfg.samples * (n_tasks + ("ppl" in cfg.tasks)) * len(codecs)
    t0 = time.time()
    with tqdm(total=total, desc="eval", unit="run", dynamic_ncols=True) as bar:
        if backend == "engine" and n_tasks:
            from oscarkv.eval.engine_backend import run_tasks_engine

            records = run_tasks_engine(loaded, codecs, cfg, artifacts, bar, Tally(sample_log))
        else:
            records = run_tasks(loaded, codecs, cfg, bar, Tally(sample_log)) if n_tasks else []
        if "ppl" in cfg.tasks:
            records += run_perplexity(loaded, codecs, cfg, bar, Tally(sample_log))
    meta = {"model": loaded.source, "backend": backend, "configs": {k: vars(c.config) for k, c in codecs.items()},
            "contexts": list(cfg.contexts), "samples": cfg.samples, "seed": cfg.seed, "haystack": cfg.haystack,
            "tasks": list(cfg.tasks), "seconds": round(time.time() - t0, 1),
            "dtype": str(next(loaded.model.parameters()).dtype),
            "artifacts": {name or "oscar": a.manifest for name, a in (artifacts or {}).items()},
            "protocol": "document prefilled at full precision, stored per method; question+answer as the next "
                        "chunk; teacher-forced greedy span match; perplexity decode-faithful"}
    return records, meta
