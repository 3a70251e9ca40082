"""The development objective and the window recipe search behind ``oscarkv calibrate --max-bpe``.

Role (issue 17): a configuration is scored on **development NIAH answer NLL** — the mean
negative log-likelihood of the answer tokens of ``niah_single`` needles hidden in the
*calibration* haystack, under seeds other than evaluation's (``DEV_SEEDS``), the answer
teacher-forced. A storage-format study found it ranks configurations the way retrieval does
where average attention errors do not (``docs/RESULTS.md``). Two protocols:

* ``served`` (the default): document, question and answer prefilled through the engine's own
  chunked prefill (``oscarkv.eval.engine_backend.score_chunked``), each 512-token chunk reading
  the earlier ones as stored, as ``serve`` prefills a prompt. One prefill per sample and
  configuration; configurations the engine does not serve are not scored.
* ``forced`` (fast): the document prefilled once at full precision and stored per
  configuration, question and answer as one more chunk (``oscarkv.eval.runner.score_sample``);
  every configuration shares each sample's prefill. It cannot see what chunked prefill loses
  when earlier chunks are read from low-bit storage (a window without a BF16 sink looks as good
  as one with it, and retrieves half as often as served: ``docs/RESULTS.md``).

:func:`search_windows` chooses the BF16 sink and recent window of an OSCAR artifact on it:
among candidate windows whose bits per element at ``context`` stay within ``max_bpe``, the one
of least development NLL (or, given ``tolerance``, the cheapest whose development accuracy is
within it of BF16's); :func:`recipe_record` is what goes into the artifact manifest
(``recipe``), with every candidate's scores. :func:`spearman` gives the rank correlation a
cheaper proxy must show against the objective before it replaces it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm.auto import tqdm

from oscarkv.config import DEV_PROTOCOLS, RUNGS, KVConfig
from oscarkv.eval import allocate as alloc
from oscarkv.eval import tasks as task_lib
from oscarkv.eval.engine_backend import engine_for, score_chunked, served
from oscarkv.eval.runner import prefill, score_sample
from oscarkv.eval.samples import answer_spans
from oscarkv.quant.artifact import ModelFingerprint, apply_recipe
from oscarkv.quant.bpe import SlidingLayers
from oscarkv.quant.codec import KVCodec, build_codec

DEV_SEEDS = (1000, 1001)
"""Seeds of the development samples (evaluation uses seed 0 by default)."""


@dataclass(frozen=True)
class DevScore:
    """One configuration on the development samples."""

    answer_nll: float
    """Mean answer-token NLL (nats; lower is better): the objective."""
    accuracy: float
    """Teacher-forced exact-match accuracy on the same samples (0..1)."""
    per_sample: tuple[float, ...]
    """Answer NLL per sample, in sample order (for paired comparisons)."""


def dev_samples(tokenizer, context: int, n: int, seeds: tuple[int, ...] = DEV_SEEDS,
                limit: int | None = None) -> list[task_lib.Sample]:
    """``n`` development ``niah_single`` samples on the calibration haystack, split over ``seeds``."""
    per = [n // len(seeds) + (i < n % len(seeds)) for i in range(len(seeds))]
    return [s for seed, k in zip(seeds, per) if k
            for s in task_lib.generate("niah_single", context, k, tokenizer, seed=seed, haystack="calibration",
                                       limit=limit)]


def dev_scores(loaded, codecs: dict[str, KVCodec], samples: list[task_lib.Sample], progress=None,
               protocol: str = "forced", artifacts: dict[str, object] | None = None, batch: int = 4) -> dict[str, DevScore]:
    """Every codec on the development samples. ``forced``: one full-precision prefill per sample,
    shared by all of them, stored per codec, the question and answer as one more chunk.
    ``served``: each codec through the engine's chunked prefill as ``serve`` runs it (one prefill
    per sample and codec; ``artifacts`` by label for ``oscar`` codecs); codecs the engine does not
    serve (no windows) are left out."""
    if protocol == "served":
        return _served_scores(loaded, codecs, samples, progress, artifacts or {}, batch)
    if protocol != "forced":
        raise ValueError(f"development protocol must be one of {DEV_PROTOCOLS}, got {protocol!r}")
    tok, model = loaded.tokenizer, loaded.model
    nll: dict[str, list[float]] = {k: [] for k in codecs}
    acc: dict[str, list[float]] = {k: [] for k in codecs}
    for sample in samples:
        doc = prefill(model, tok(sample.document, add_special_tokens=False, return_tensors="pt").input_ids)
        q_ids = tok(sample.question, add_special_tokens=False, return_tensors="pt").input_ids
        target, spans = answer_spans(tok, task_lib.answer_target(sample), sample.answers)
        for label, codec in codecs.items():
            a, n, _ = score_sample(model, doc, codec, q_ids, target, spans)
            acc[label].append(a)
            nll[label].append(n)
        if progress is not None:
            progress(sample, {k: v[-1] for k, v in nll.items()}, {k: v[-1] for k, v in acc.items()})
    return {k: DevScore(sum(nll[k]) / len(nll[k]), sum(acc[k]) / len(acc[k]), tuple(nll[k])) for k in codecs}


def _served_scores(loaded, codecs: dict[str, KVCodec], samples: list[task_lib.Sample], progress,
                   artifacts: dict[str, object], batch: int) -> dict[str, DevScore]:
    tok = loaded.tokenizer
    prompts, targets, spans = [], [], []
    for s in samples:
        prompts.append(tok(s.document, add_special_tokens=False).input_ids
                       + tok(s.question, add_special_tokens=False).input_ids)
        target, sp = answer_spans(tok, task_lib.answer_target(s), s.answers)
        targets.append(target[0].tolist())
        spans.append(sp)
    context = max(len(p) + len(t) for p, t in zip(prompts, targets))
    rows: dict[str, list[tuple[float, float]]] = {}
    todo = {k: c for k, c in codecs.items() if served(c.config)}
    with tqdm(total=len(todo) * len(samples), desc="development samples, as served", unit="prefill") as bar:
        for label, codec in todo.items():
            engine = engine_for(loaded, codec.config, artifacts.get(label), context, batch)
            rows[label] = []
            for i in range(0, len(samples), batch):
                rows[label] += score_chunked(engine, prompts[i:i + batch], targets[i:i + batch], spans[i:i + batch])
                bar.update(len(prompts[i:i + batch]))
            bar.set_postfix_str(f"{label}: {sum(n for _, n in rows[label]) / len(samples):.3f} nats")
    if progress is not None:
        for i, sample in enumerate(samples):
            progress(sample, {k: v[i][1] for k, v in rows.items()}, {k: v[i][0] for k, v in rows.items()})
    return {k: DevScore(sum(n for _, n in v) / len(v), sum(a for a, _ in v) / len(v), tuple(n for _, n in v))
            for k, v in rows.items()}


def window_codecs(loaded, artifact, context: int, max_bpe: float | None, base: KVConfig,
                  sinks: tuple[int, ...], recents: tuple[int, ...], rungs: tuple[str, ...] = ("int2",),
                  key_clips: tuple[float, ...] = (), levels: tuple[str, ...] = ("uniform",),
                  pages: tuple[int, ...] = ()) -> dict[str, KVCodec]:
    """``oscar s=SINK r=RECENT`` codecs (``oscar-RUNG s=...`` for a rung other than INT2; ``... c=CLIP``
    for a key clip in place of the fitted ones; ``... lm`` for Lloyd-Max levels; ``... p=PAGE`` for a page size
    other than ``base``'s) for every candidate window the engine serves (a sink of whole pages; a recent window
    unless there is no window at all: page size 1, as :class:`~oscarkv.config.EngineConfig` requires), page
    size of ``pages`` (empty: ``base``'s), rung, key clip and level table within ``max_bpe`` at ``context``."""
    out = {}
    for page in pages or (base.page_size,):
        mine = replace(base, page_size=page)
        found = _windows_at(loaded, artifact, context, max_bpe, mine, sinks, recents, rungs, key_clips, levels)
        out |= {k + ("" if page == base.page_size else f" p={page}"): v for k, v in found.items()}
    return out


def _windows_at(loaded, artifact, context, max_bpe, base, sinks, recents, rungs, key_clips, levels) -> dict[str, KVCodec]:
    """:func:`window_codecs` at ``base``'s page size."""
    c = loaded.model.config
    dims = ModelFingerprint.from_config(c).kv_dims
    out = {}
    for rung, clip, lv in ((r, k, lv) for r in rungs for k in (None, *key_clips) for lv in levels):
        kb, vb = RUNGS[rung]
        if (clip is not None and kb != 2) or (lv != "uniform" and kb == vb == 4):
            continue  # 4-bit keys are not clipped; 4-bit codes keep uniform levels
        for s in (s for s in sinks if s % base.page_size == 0):
            for r in recents:
                kv = replace(base, method="oscar", sink=s, recent=r, group_size=artifact.manifest["group_size"],
                             key_bits=kb, value_bits=vb, key_clip=clip, levels=lv)
                if s == 0 and r == 0:
                    kv = kv.without_windows()
                elif r == 0 and kv.page_size > 1:
                    continue  # a decode step would demote the page holding its own token: not served
                codec = build_codec(kv, *dims, artifact, SlidingLayers.from_config(c))
                if max_bpe is None or codec.bpe(context) <= max_bpe:
                    name = f"oscar{'' if rung == 'int2' else '-' + rung} s={s} r={r}"
                    name += "" if clip is None else f" c={clip:g}"
                    out[name + ("" if lv == "uniform" else " lm")] = codec
    return out


def choose(scores: dict[str, DevScore], codecs: dict[str, KVCodec], context: int, reference: DevScore | None = None,
           tolerance: float | None = None) -> str:
    """The label chosen: least NLL (ties: fewer bits); with ``tolerance``, the cheapest whose
    development accuracy is at least ``(1 - tolerance)`` times the reference's (else least NLL)."""
    order = sorted(scores, key=lambda k: (codecs[k].bpe(context), scores[k].answer_nll))
    if tolerance is not None and reference is not None:
        ok = [k for k in order if scores[k].accuracy >= (1 - tolerance) * reference.accuracy]
        if ok:
            return ok[0]
    return min(order, key=lambda k: (round(scores[k].answer_nll, 3), codecs[k].bpe(context)))


def recipe_record(label: str, scores: dict[str, DevScore], codecs: dict[str, KVCodec], context: int,
                  dev: dict, reference: DevScore | None = None) -> dict:
    """The manifest's ``recipe``: the chosen windows, how they were chosen, every candidate's scores."""
    kv = codecs[label].config
    cands = [{"sink": codecs[k].config.sink, "recent": codecs[k].config.recent,
              "page_size": codecs[k].config.page_size, "key_bits": codecs[k].config.key_bits,
              "value_bits": codecs[k].config.value_bits, **_clip_field(codecs[k].config),
              **_layer_bits_field(codecs[k].config),
              "bpe": round(codecs[k].bpe(context), 4),
              "answer_nll": round(v.answer_nll, 4), "accuracy": round(v.accuracy, 4)} for k, v in scores.items()]
    out = {"method": "oscar", "sink": kv.sink, "recent": kv.recent, "page_size": kv.page_size,
           "key_bits": kv.key_bits, "value_bits": kv.value_bits, **_clip_field(kv), **_layer_bits_field(kv),
           "bpe": round(codecs[label].bpe(context), 4), "objective": "development NIAH answer NLL",
           "context": context, **dev, "candidates": cands}
    if reference is not None:
        out["bf16"] = {"answer_nll": round(reference.answer_nll, 4), "accuracy": round(reference.accuracy, 4)}
    return out


def _layer_bits_field(kv: KVConfig) -> dict:
    """An allocation as the recipe records it, every layer present: a per-layer one's bits (``layer_key_bits``,
    ``layer_value_bits``), a per-head one's 4-bit key heads (``layer_key_heads``, a list per layer); nothing
    without one."""
    out = {}
    if kv.layer_key_bits or kv.layer_value_bits:
        n = max(len(kv.layer_key_bits), len(kv.layer_value_bits))
        out = {name: [kv.layer_bits(i)[j] for i in range(n)]
               for j, name in enumerate(("layer_key_bits", "layer_value_bits"))}
    if kv.layer_key_heads:
        out["layer_key_heads"] = [list(kv.key_heads(i)) for i in range(len(kv.layer_key_heads))]
    return out


def _clip_field(kv: KVConfig) -> dict:
    """``{"key_clip": c}`` for a candidate with a key clip in place of the fitted ones, ``{"levels": ...}`` for
    one with non-uniform levels; nothing for the fitted clips and uniform levels."""
    return ({} if kv.key_clip is None else {"key_clip": kv.key_clip}) | (
        {} if kv.levels == "uniform" else {"levels": kv.levels})


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def search_windows(loaded, artifact, cfg, extra: dict[str, KVCodec] | None = None,
                   progress=None, extra_artifacts: dict[str, object] | None = None) -> tuple[dict, dict[str, DevScore]]:
    """Score BF16, every candidate window within ``cfg.max_bpe`` at ``cfg.context`` and the
    ``extra`` codecs (ablations, reported only) on ``cfg.dev_samples`` development samples of
    ``cfg.dev_context`` tokens, under ``cfg.protocol``; returns (the manifest's ``recipe``, every score).
    ``cfg`` is a :class:`~oscarkv.config.RecipeSearchConfig`."""
    c = loaded.model.config
    bf16 = {"bf16": build_codec(KVConfig("bf16"), *ModelFingerprint.from_config(c).kv_dims,
                                sliding=SlidingLayers.from_config(c))}
    windows = window_codecs(loaded, artifact, cfg.context, cfg.max_bpe, KVConfig(), cfg.sinks, cfg.recents, cfg.rungs,
                            cfg.key_clips, cfg.levels, cfg.pages)
    if not windows:
        raise ValueError(f"no window fits --max-bpe {cfg.max_bpe} at --context {cfg.context}")
    limit = getattr(c, "max_position_embeddings", None)
    samples = dev_samples(loaded.tokenizer, cfg.dev_context, cfg.dev_samples, cfg.dev_seeds, limit)
    sens = None
    if cfg.allocate:
        windows, sens = with_allocations(loaded, artifact, cfg, windows, samples)
    arts = {k: artifact for k in windows} | (extra_artifacts or {})
    scores = dev_scores(loaded, bf16 | windows | (extra or {}), samples, progress, cfg.protocol, arts)
    mine = {k: scores[k] for k in windows if k in scores}
    if not mine:
        raise ValueError("no candidate window is served by the engine: give --recents other than 0")
    label = choose(mine, windows, cfg.context, scores["bf16"], cfg.tolerance)
    dev = {"max_bpe": cfg.max_bpe, "tolerance": cfg.tolerance, "protocol": cfg.protocol, "dev_context": cfg.dev_context,
           "dev_samples": len(samples), "dev_seeds": list(cfg.dev_seeds), "haystack": "calibration"}
    recipe = recipe_record(label, mine, windows, cfg.context, dev, scores["bf16"])
    if sens is not None:
        recipe["sensitivity"] = [{"layer": s.layer, "kind": s.kind, **({} if s.head is None else {"head": s.head}),
                                  "gain": round(s.gain, 4), "stderr": round(s.stderr, 4)} for s in sens]
    return recipe, scores


def with_allocations(loaded, artifact, cfg, windows: dict[str, KVCodec], samples) -> tuple[dict[str, KVCodec], list]:
    """``windows`` and, for each INT2 one, its greedy allocation (per layer, or per KV head for ``key-heads``) within
    ``cfg.max_bpe`` (``oscarkv.eval.allocate``), from sensitivities measured on ``samples`` against the INT2 recipe at
    the default windows, or those of the artifact's recipe (the unit's contribution, not the window's, is what they
    rank)."""
    c = loaded.model.config
    dims = ModelFingerprint.from_config(c).kv_dims

    def build(kv: KVConfig) -> KVCodec:
        return build_codec(kv, *dims, artifact, SlidingLayers.from_config(c))

    # the artifact's INT2 recipe (or the default windows), no allocation
    base = replace(apply_recipe(KVConfig(group_size=artifact.manifest["group_size"]), artifact), key_bits=2, value_bits=2,
                   layer_key_bits=(), layer_value_bits=(), layer_key_heads=())
    codecs = alloc.sensitivity_codecs(base, dims[0], build, cfg.allocate, dims[1])
    with tqdm(total=len(samples), desc=f"sensitivities ({len(codecs)} configurations)", unit="sample") as bar:
        scores = dev_scores(loaded, codecs, samples, lambda *_: bar.update(1), cfg.protocol, {k: artifact for k in codecs})
    sens = alloc.sensitivities(scores, cfg.allocate, dims[0], artifact.manifest.get("summary"), dims[1])
    known = [s for s in sens if s.predicted is not None]
    rho = spearman([s.predicted for s in known], [s.gain for s in known]) if len(known) > 2 else None
    print("sensitivities (development answer NLL gain, that layer's keys or values, or that head's keys, alone at "
          "4 bits):\n"
          + "\n".join(alloc.report(sens))  # NOTE: the calibration predicts per layer only: no rho for heads alone
          + (f"\n  Spearman's rho of the calibration's predicted INT2 error with the measured gain: {rho:+.2f}"
             if rho is not None else ""), flush=True)
    return windows | alloc.allocation_codecs(sens, windows, dims[0], build, cfg.context, cfg.max_bpe), sens


def search_recipe(loaded, results: dict, search, out: Path) -> dict:
    """``oscarkv calibrate --max-bpe``'s step after the fit: choose the windows for ``results[""]``
    (the recipe's artifact, whose manifest gets the ``recipe``), score the ablations beside them
    without windows, and write the study (every score; the rank correlation with the objective of
    each cheaper proxy) to ``out/dev_study.json``, each sample's scores to ``out/dev_samples.jsonl``
    as they are measured. Returns the ``recipe``."""
    c = loaded.model.config
    dims = ModelFingerprint.from_config(c).kv_dims
    arts = {name or "recipe": art for name, (art, _) in results.items()}
    extra = {f"ablation {n}": build_codec(KVConfig("oscar", group_size=a.manifest["group_size"]).without_windows(),
                                          *dims, a, SlidingLayers.from_config(c)) for n, a in arts.items() if n != "recipe"}

    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "dev_samples.jsonl", "w")

    def progress(sample, nll, acc):
        log.write(json.dumps({"seed": sample.seed, "nll": nll, "accuracy": acc}) + "\n")
        log.flush()
        print(f"dev sample seed {sample.seed}: bf16 {nll['bf16']:.3f}, best window "
              f"{min(v for k, v in nll.items() if k.startswith('oscar') and ' s=' in k):.3f} nats", flush=True)

    with log:
        recipe, scores = search_windows(loaded, arts["recipe"], search, extra, progress,
                                        {f"ablation {n}": a for n, a in arts.items() if n != "recipe"})
    results[""][0].manifest["recipe"] = recipe
    first = search.dev_seeds[0]
    n_first = -(-search.dev_samples // len(search.dev_seeds))  # the first seed's share (dev_samples)
    names = list(scores)
    nll = [scores[k].answer_nll for k in names]
    proxies = {"accuracy (teacher-forced, same samples)": [-scores[k].accuracy for k in names],
               f"answer NLL on seed {first} alone ({n_first} samples)": [
                   sum(scores[k].per_sample[:n_first]) / n_first for k in names]}
    rho = {p: round(spearman(v, nll), 3) for p, v in proxies.items()}
    pred = {n: _predicted_error(a.manifest) for n, a in arts.items()}
    if len(pred) > 2:
        keys = [n for n in pred if (f"ablation {n}" if n != "recipe" else "oscar s=0 r=0") in scores]
        obj = [scores[f"ablation {n}" if n != "recipe" else "oscar s=0 r=0"].answer_nll for n in keys]
        rho["calibration's predicted INT2 error (recipe and ablations, no windows)"] = round(
            spearman([pred[n] for n in keys], obj), 3)
    study = {"recipe": {k: v for k, v in recipe.items() if k != "candidates"}, "spearman_with_dev_nll": rho,
             "scores": {k: {"answer_nll": round(v.answer_nll, 4), "accuracy": round(v.accuracy, 4),
                            "per_sample": [round(x, 4) for x in v.per_sample]} for k, v in scores.items()},
             "predicted_error": pred}
    out.mkdir(parents=True, exist_ok=True)
    (out / "dev_study.json").write_text(json.dumps(study, indent=2) + "\n")
    clip = f", key clip {recipe['key_clip']}" if "key_clip" in recipe else ""
    clip += f", {recipe['levels']} levels" if "levels" in recipe else ""
    clip += f", per-layer key bits {''.join(map(str, recipe['layer_key_bits']))}" if "layer_key_bits" in recipe else ""
    clip += f", 4-bit key heads {sum(map(len, recipe['layer_key_heads']))}" if "layer_key_heads" in recipe else ""
    print(f"recipe: key bits {recipe['key_bits']}, value bits {recipe['value_bits']}{clip}, sink {recipe['sink']}, recent "
          f"{recipe['recent']}, page {recipe['page_size']} ({recipe['bpe']:.3f} bits per element at "
          f"{recipe['context']} tokens), development answer NLL {scores_of(recipe)} vs BF16 "
          f"{recipe['bf16']['answer_nll']:.3f}; study in {out / 'dev_study.json'}")
    return recipe


def scores_of(recipe: dict) -> str:
    def key(c: dict) -> tuple:
        return (c["sink"], c["recent"], c.get("key_bits", 2), c.get("value_bits", 2), c.get("key_clip"),
                c.get("levels", "uniform"), c.get("layer_key_bits"), c.get("layer_value_bits"), c.get("layer_key_heads"))
    mine = next(c for c in recipe["candidates"] if key(c) == key(recipe))
    return f"{mine['answer_nll']:.3f} (accuracy {100 * mine['accuracy']:.0f}%)"


def _predicted_error(manifest: dict) -> float:
    """Mean over layers of the calibration's predicted K and V INT2 error ratios (vs Hadamard only)."""
    rows = manifest.get("summary") or []
    vals = [(r["key_error_ratio"] + r["value_error_ratio"]) / 2 for r in rows]
    return round(sum(vals) / len(vals), 4) if vals else float("nan")
