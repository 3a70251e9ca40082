"""The accuracy harness behind ``oscarkv eval`` and ``oscarkv demo``.

Measurements per KV configuration (a :class:`~oscarkv.config.KVConfig`, with and without
BF16 windows), each record tagged with its protocol (``PROTOCOLS``) and haystack:

* **Free-running through the engine** (``backend="engine"``, the headline: what ``serve``
  returns): :mod:`oscarkv.eval.engine_backend` — chunked prefill, greedy generation, answers
  string-matched in the generated text. Configurations the engine cannot serve (no windows,
  methods without engine pages) are not run there.
* **Teacher-forced single chunk** (``backend="hf"``, and the diagnostic beside the engine's on
  the same samples). The document is prefilled once per sample at full precision, then, per
  method, its K/V are written into an :class:`~oscarkv.cache.hf_cache.OscarCache` exactly as a
  prefill would store them, and the question *and the gold answer* run as the next
  full-precision chunk against the cache as stored: an answer counts when every one of its
  tokens is the argmax given the gold prefix. Kinder than serving: no question or answer token
  ever reads another from low-bit storage, and the document never attends to stored chunks.
  Multi-answer tasks score the fraction of answers matched (RULER's partial credit).
* **Decode-faithful perplexity (``oscarkv.eval.faithful``)** on natural text windows.

Each synthetic sample is also tagged with where its needles lie (``window``: in the BF16
recent window or sink when generation starts; ``history``: in low-bit storage), so records split
the two. Records go to ``oscarkv.eval.report``. The unquantized method
(``bf16``) stores K/V in the model's dtype, so its rows are labelled with that dtype
(:func:`baseline_label`: ``fp32`` for a float32 model on the CPU, ``bf16`` on a GPU) and carry
its BPE (32 or 16).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from typing import TextIO

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from oscarkv.cache.hf_cache import TIERS, OscarCache, cache_kwargs
from oscarkv.config import EvalConfig, KVConfig
from oscarkv.eval import engine_backend
from oscarkv.eval import tasks as task_lib
from oscarkv.eval.samples import answer_spans, needle_place, task_samples
from oscarkv.eval.faithful import faithful_logits
from oscarkv.eval.perplexity_data import max_windows, text_windows
from oscarkv.quant.artifact import ModelFingerprint, apply_recipe
from oscarkv.quant.bpe import SlidingLayers
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


DTYPE_LABELS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def baseline_label(dtype: torch.dtype) -> str:
    """Report label of the unquantized method: the dtype its cache stores (the model's)."""
    return DTYPE_LABELS.get(dtype, str(dtype).removeprefix("torch."))


def full_bits(loaded) -> float:
    """BPE of the unquantized method: the width of the model's dtype, which its cache stores."""
    return 8.0 * next(loaded.model.parameters()).dtype.itemsize


def build_codecs(model, cfg: EvalConfig, artifacts: dict[str, object] | None = None) -> dict[str, KVCodec]:
    """One codec per report label. ``artifacts`` maps a variant name to an OSCAR artifact;
    the unnamed variant ``""`` is reported as ``oscar``, others as ``oscar:NAME``; ``bf16`` is
    reported as :func:`baseline_label`. With windows, an artifact whose manifest holds a
    ``recipe`` (``oscarkv calibrate --max-bpe``) gets that recipe's windows, as ``serve`` does;
    the others get ``cfg.kv``'s."""
    c = model.config
    dims = ModelFingerprint.from_config(c).kv_dims
    out = {}
    for kv in kv_configs(cfg):
        windowed = kv.sink or kv.recent
        variants = (artifacts or {"": None}) if kv.method == "oscar" else {"": None}
        for name, art in (variants if windowed else _distinct_rotations(variants)).items():
            label = kv.label().replace("oscar", f"oscar:{name}", 1) if name else kv.label()
            if kv.method == "bf16":
                label = baseline_label(next(model.parameters()).dtype)
            out[label] = build_codec(apply_recipe(kv, art) if windowed else kv, *dims, art, SlidingLayers.from_config(c))
    return out


def _distinct_rotations(variants: dict[str, object]) -> dict[str, object]:
    """The first variant of each set of rotations: without windows no recipe applies, so variants that differ
    only in their recipe (``Artifact.with_recipe`` shares the tensors) are one configuration."""
    out, seen = {}, set()
    for name, art in variants.items():
        key = id(art.tensors) if art is not None else None
        if key not in seen:
            seen.add(key)
            out[name] = art
    return out


def on_model(model, t: torch.Tensor) -> torch.Tensor:
    """``t`` on the device of ``model``'s weights (token ids and positions are built on the host)."""
    return t.to(next(model.parameters()).device)


@torch.inference_mode()
def prefill(model, ids: torch.Tensor) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    model(on_model(model, ids), **cache_kwargs(cache), use_cache=True, logits_to_keep=1)  # only the K/V are needed
    return cache


@torch.inference_mode()
def score_sample(model, doc: DynamicCache, codec: KVCodec, q_ids: torch.Tensor, target: torch.Tensor,
                 spans: list[tuple[int, int]]) -> tuple[float, float, OscarCache]:
    """Fraction of answer spans (token index ranges in ``target``) predicted exactly, and the
    mean negative log-likelihood of the answer tokens (a continuous score for small studies)."""
    cache = OscarCache.from_codec(codec)
    cache.store(doc)
    start = doc.get_seq_length()
    q_ids, target = on_model(model, q_ids), on_model(model, target)
    ids = torch.cat([q_ids, target[:, :-1]], dim=1)
    pos = on_model(model, torch.arange(start, start + ids.shape[1]).unsqueeze(0))
    logits = model(ids, **cache_kwargs(cache), position_ids=pos, use_cache=True).logits
    answer_logits = logits[0, q_ids.shape[1] - 1:].float()
    ok = answer_logits.argmax(-1) == target[0]
    nll = torch.nn.functional.cross_entropy(answer_logits, target[0], reduction="none")
    answer_nll = float(torch.cat([nll[a:b] for a, b in spans]).mean())
    return sum(bool(ok[a:b].all()) for a, b in spans) / len(spans), answer_nll, cache


Key = tuple[str, str, int, str, str]
"""A cell: (method label, task, context, haystack, protocol)."""

FORCED, FREE, FAITHFUL = "forced", "free", "faithful"
"""Protocols: teacher-forced single chunk (diagnostic), free-running greedy generation through
the engine (what ``serve`` returns), decode-faithful perplexity."""


class Tally:
    """Running sums per cell → records; every sample is also logged as a JSON line as soon as
    it is scored, so an interrupted run loses nothing. Samples tagged with a needle ``place``
    (``window`` / ``history``, :func:`oscarkv.eval.samples.needle_place`) are also summed apart."""

    def __init__(self, log: TextIO | None = None) -> None:
        self.sums: dict[Key, list[float]] = {}
        self.nll: dict[Key, list[float]] = {}  # answer NLLs, where measured
        self.places: dict[Key, dict[str, list[float]]] = {}
        self.values: dict[Key, list[float]] = {}  # per sample, in scoring order (paired comparisons)
        self.log = log

    def add(self, key: Key, value: float, bpe: float, kv_bytes: int | None = None,
            answer_nll: float | None = None, place: str | None = None) -> None:
        if self.log is not None:
            row = dict(zip(("method", "task", "context", "haystack", "protocol"), key), value=value, bpe=bpe,
                       kv_bytes=kv_bytes)
            row |= {k: v for k, v in (("answer_nll", answer_nll), ("place", place)) if v is not None}
            self.log.write(json.dumps(row) + "\n")
            self.log.flush()
        if answer_nll is not None:
            self.nll.setdefault(key, []).append(answer_nll)
        if place is not None:
            p = self.places.setdefault(key, {}).setdefault(place, [0.0, 0])
            p[0] += value
            p[1] += 1
        self.values.setdefault(key, []).append(value)
        s = self.sums.setdefault(key, [0.0, 0, 0.0, 0])
        s[0] += value
        s[1] += 1
        s[2] += bpe
        s[3] += kv_bytes or 0

    def records(self, metric: str) -> list[dict]:
        out = []
        for key, (total, n, bpe, nbytes) in self.sums.items():
            rec = dict(zip(("method", "task", "context", "haystack", "protocol"), key), samples=n,
                       bpe=round(bpe / n, 4))
            rec[metric] = math.exp(total / n) if metric == "perplexity" else total / n
            if nbytes:
                rec["kv_bytes"] = nbytes // n
            if key_nll := self.nll.get(key):
                rec["answer_nll"] = round(sum(key_nll) / len(key_nll), 4)
            for place, (v, k) in sorted(self.places.get(key, {}).items()):
                rec[place] = {"samples": k, metric: v / k}
            if metric == "accuracy":
                rec["values"] = self.values[key]
            out.append(rec)
        return out


def records_from_log(lines) -> list[dict]:
    """Rebuild the records of a run from its per-sample JSON lines (an interrupted run included).

    ``ppl`` lines hold a token-mean negative log-likelihood, the others an accuracy. Lines of
    older runs without haystack or protocol count as ``eval`` and teacher-forced."""
    tallies = {"accuracy": Tally(), "perplexity": Tally()}
    for line in lines:
        if line.strip():
            row = json.loads(line)
            ppl = row["task"] == "ppl"
            key = (row["method"], row["task"], row["context"], row.get("haystack", "eval"),
                   row.get("protocol", FAITHFUL if ppl else FORCED))
            tallies["perplexity" if ppl else "accuracy"].add(key, row["value"], row["bpe"], row.get("kv_bytes"),
                                                             row.get("answer_nll"), row.get("place"))
    return [rec for metric, tally in tallies.items() for rec in tally.records(metric)]


def cells(loaded, cfg: EvalConfig):
    """Every (context, task, haystack, sample) of the synthetic tasks, in run order."""
    for ctx in cfg.contexts:
        for task in (t for t in cfg.tasks if t != "ppl"):
            for haystack in cfg.haystacks:
                for sample in task_samples(loaded, task, ctx, cfg, haystack):
                    yield ctx, task, haystack, sample


def score_forced(loaded, codecs: dict[str, KVCodec], sample, places: dict[str, str], tally: Tally) -> DynamicCache:
    """The teacher-forced single-chunk protocol for one sample: one prefill, every codec
    (``places``: where the needles lie for each). Returns the document's full-precision cache
    (no codec changes it)."""
    tok = loaded.tokenizer
    doc_ids = tok(sample.document, add_special_tokens=False, return_tensors="pt").input_ids
    q_ids = tok(sample.question, add_special_tokens=False, return_tensors="pt").input_ids
    target, spans = answer_spans(tok, task_lib.answer_target(sample), sample.answers)
    doc = prefill(loaded.model, doc_ids)
    for label, codec in codecs.items():
        acc, nll, cache = score_sample(loaded.model, doc, codec, q_ids, target, spans)
        # measured from the bytes the cache holds (document + question + answer)
        held = sum(v for k, v in cache.memory_bytes().items() if k in TIERS)
        tally.add((label, sample.task, sample.context, sample.haystack, FORCED), acc, cache.bpe(), held, nll,
                  places[label])
    return doc


@torch.inference_mode()
def greedy_full_precision(loaded, doc: DynamicCache, sample, max_tokens: int) -> str:
    """Greedy generation after ``document + question`` from the document's full-precision cache
    (extended in place): BF16's free-running answer without a second prefill. The engine's
    ``bf16`` pools of an fp32 model hold K/V unrounded, so this is the engine's computation."""
    tok, model = loaded.tokenizer, loaded.model
    ids = tok(sample.question, add_special_tokens=False, return_tensors="pt").input_ids
    eos = {tok.eos_token_id} | set(_as_list(getattr(model.config, "eos_token_id", None)))
    out: list[int] = []
    for _ in range(max_tokens):
        start = doc.get_seq_length()
        pos = torch.arange(start, start + ids.shape[1]).unsqueeze(0)
        logits = model(on_model(model, ids), **cache_kwargs(doc), position_ids=on_model(model, pos), use_cache=True,
                       logits_to_keep=1).logits
        nxt = int(logits[0, -1].argmax())
        if nxt in eos:
            break
        out.append(nxt)
        ids = torch.tensor([[nxt]])
    return tok.decode(out, skip_special_tokens=True)


def _as_list(x) -> list:
    return [x] if isinstance(x, int) else list(x or [])


@dataclass(frozen=True)
class _Prompt:
    """One sample as the engine gets it: its prompt ids, answer length and, per report label,
    where its needles lie (:func:`needle_place` under that label's windows)."""

    sample: task_lib.Sample
    ids: list[int]  # document + question, each tokenized alone (as the diagnostic feeds them)
    answer_tokens: int
    places: dict[str, str]

    @property
    def cell(self) -> tuple[str, int, str]:
        return self.sample.task, self.sample.context, self.sample.haystack

    @classmethod
    def of(cls, tok, sample: task_lib.Sample, codecs: dict[str, KVCodec]) -> _Prompt:
        ids = tok(sample.document, add_special_tokens=False).input_ids + tok(
            sample.question, add_special_tokens=False).input_ids
        n_answer = len(tok(task_lib.answer_target(sample), add_special_tokens=False).input_ids)
        windows = {(c.config.sink, c.config.recent) for c in codecs.values()}
        place = {w: needle_place(tok, sample, KVConfig(sink=w[0], recent=w[1])) for w in windows}
        return cls(sample, ids, n_answer, {k: place[c.config.sink, c.config.recent] for k, c in codecs.items()})


def _groups(items, size: int):
    """``items`` in consecutive lists of ``size`` (the last may be shorter)."""
    group = []
    for item in items:
        group.append(item)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def run_tasks(loaded, codecs: dict[str, KVCodec], cfg: EvalConfig, bar: tqdm, tally: Tally,
              backend: str = "hf", artifacts: dict | None = None) -> list[dict]:
    """Score every sample: teacher-forced single chunk (``hf``), or free-running through the
    engine for the served configurations with the teacher-forced diagnostic beside it
    (``engine``; ``cfg.diagnostic``), on the same samples. With ``cfg.bf16_on_engine`` off,
    BF16's free-running answer comes from :func:`greedy_full_precision` on the diagnostic's prefill."""
    served = {k: codecs[k] for k in _served(codecs, cfg, backend)}
    on_hf = {k for k, c in served.items() if c.config.method == "bf16" and not cfg.bf16_on_engine}
    engines = engine_backend.build_engines(loaded, {k: c for k, c in served.items() if k not in on_hf}, cfg, artifacts)
    for group in _groups(cells(loaded, cfg), cfg.batch):
        batch = [_Prompt.of(loaded.tokenizer, sample, codecs) for _, _, _, sample in group]
        for label, engine in engines.items():
            scores = engine_backend.score_free(engine, [p.ids for p in batch], [p.sample for p in batch],
                                               [p.answer_tokens for p in batch])
            for p, (acc, bpe, _) in zip(batch, scores):
                tally.add((label, *p.cell, FREE), acc, bpe, place=p.places[label])
            bar.update(len(batch))
        for p in batch:
            if _forced(cfg, backend, on_hf):
                doc = score_forced(loaded, codecs, p.sample, p.places, tally)
                bar.update(len(codecs))
                for label in on_hf:
                    budget = engine_backend.answer_budget(p.answer_tokens, len(p.ids),
                                                          getattr(loaded.config, "max_position_embeddings", None))
                    text = greedy_full_precision(loaded, doc, p.sample, budget)
                    tally.add((label, *p.cell, FREE), task_lib.score_text(p.sample, text), full_bits(loaded),
                              place=p.places[label])
                    bar.update(1)
    return tally.records("accuracy")


def _forced(cfg: EvalConfig, backend: str, on_hf) -> bool:
    """Whether the teacher-forced single-chunk protocol runs on every sample (``run_tasks``)."""
    return backend == "hf" or cfg.diagnostic or bool(on_hf)


def _served(codecs: dict[str, KVCodec], cfg: EvalConfig, backend: str) -> list[str]:
    """The configurations that also answer free-running (through the engine, or BF16 on its prefill)."""
    return [k for k, c in codecs.items() if backend == "engine" and engine_backend.served(c.config)
            and (not cfg.free or c.config.method in cfg.free)]


def run_perplexity(loaded, codecs: dict[str, KVCodec], cfg: EvalConfig, bar: tqdm, tally: Tally) -> list[dict]:
    for ctx in cfg.contexts:
        n = min(cfg.samples, max_windows(loaded.tokenizer, ctx))  # the text holds only so many windows
        for window in text_windows(loaded.tokenizer, ctx, n, seed=cfg.seed):
            ids = on_model(loaded.model, window.view(1, -1))
            for label, codec in codecs.items():
                logits = faithful_logits(loaded.model, ids, codec).float()
                nll = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
                bpe = codec.bpe(ctx) if codec.quantized else full_bits(loaded)
                tally.add((label, "ppl", ctx, "eval", FAITHFUL), float(nll), bpe)
                bar.update(1)
    return tally.records("perplexity")


def evaluate(loaded, cfg: EvalConfig, artifacts: dict[str, object] | None = None,
             sample_log: TextIO | None = None, backend: str = "hf") -> tuple[list[dict], dict]:
    """Run every configured measurement; returns (records, meta). Per-sample scores are
    written to ``sample_log`` (JSON lines) as they are measured. ``backend="engine"`` adds the
    free-running protocol through the paged engine (``oscarkv.eval.engine_backend``)."""
    codecs = build_codecs(loaded.model, cfg, artifacts)
    served = _served(codecs, cfg, backend)
    n_tasks = sum(t != "ppl" for t in cfg.tasks)
    on_hf = [k for k in served if codecs[k].config.method == "bf16" and not cfg.bf16_on_engine]
    per_sample = len(served) + (len(codecs) if _forced(cfg, backend, on_hf) else 0)  # the runs bar.update counts
    total = len(cfg.contexts) * cfg.samples * (n_tasks * len(cfg.haystacks) * per_sample + ("ppl" in cfg.tasks) * len(codecs))
    t0 = time.time()
    # NOTE: runs differ in cost (an engine's free run, one codec's forced score): the estimate uses the
    # mean rate since the start (smoothing 0), not the last few updates
    with tqdm(total=total, desc="eval", unit="run", dynamic_ncols=True, smoothing=0) as bar:
        tally = Tally(sample_log)
        records = run_tasks(loaded, codecs, cfg, bar, tally, backend, artifacts) if n_tasks else []
        if "ppl" in cfg.tasks:
            records += run_perplexity(loaded, codecs, cfg, bar, Tally(sample_log))
    meta = {"model": loaded.source, "backend": backend, "configs": {k: vars(c.config) for k, c in codecs.items()},
            "contexts": list(cfg.contexts), "samples": cfg.samples, "seed": cfg.seed, "haystacks": list(cfg.haystacks),
            "tasks": list(cfg.tasks), "seconds": round(time.time() - t0, 1),
            "dtype": str(next(loaded.model.parameters()).dtype), "served": served,
            "artifacts": {name or "oscar": a.manifest for name, a in (artifacts or {}).items()},
            "protocol": PROTOCOLS, **provenance(loaded)}
    return records, meta


def provenance(loaded) -> dict:
    """Where, when and by which command the run was made (the plots print it under their title)."""
    device = next(loaded.model.parameters()).device
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"CPU ({os.cpu_count()} cores, {platform.machine()})")
    argv = ["oscarkv", *sys.argv[1:]] if pathlib.Path(sys.argv[0]).name in ("oscarkv", "__main__.py") else sys.argv
    return {"device": name, "date": time.strftime("%Y-%m-%d", time.gmtime()), "command": shlex.join(argv)}


PROTOCOLS = {FREE: "free-running: prompt prefilled by the engine's chunked prefill, greedy generation token by "
                   "token through the paged engine as served; answers string-matched in the generated text",
             FORCED: "teacher-forced diagnostic: document prefilled at full precision in one chunk and stored "
                     "per method; question + gold answer as one more full-precision chunk; an answer counts when "
                     "each of its tokens is the argmax",
             FAITHFUL: "perplexity: decode-faithful (every token reads the cache as stored)"}
"""What each protocol measures (the report prints it)."""
