"""The synthetic tasks through the paged engine: what ``serve`` returns (``oscarkv eval --backend engine``).

Role: the headline protocol, **free-running** (:func:`score_free`): one request per (sample, KV
configuration) whose prompt is ``document + question``, prefilled by the engine's own chunked
prefill (chunks of ``EngineConfig.prefill_chunk`` tokens, each attending to the earlier ones as
stored), then greedy generation token by token from the cache as stored; the answer is scored
from the generated text with RULER's string match (:func:`oscarkv.eval.tasks.score_text`).
Several samples run at once as concurrent requests (``EvalConfig.batch``), as ``serve`` batches
its clients: prefill chunk boundaries depend on positions only, so each answer is the one a
request alone would get (``tests/eval/test_engine_eval.py``).
Only configurations the engine serves run here (:func:`served`): methods in ``ENGINE_METHODS``
with their BF16 windows; the others are measured by the teacher-forced diagnostic alone and
labelled "not served". The runner (``oscarkv.eval.runner``) drives the loop and scores the
diagnostic on the same samples.

:func:`score_chunked` is the development objective as served: document, question and gold
answer prefilled by the same chunked prefill, the answer tokens' log-probabilities read from the
prompt's (``oscarkv.eval.objective``, ``protocol="served"``).
:func:`score_engine` keeps the teacher-forced protocol on the engine (document as one chunk,
question and gold answer as the next, argmax per answer token): it is the bridge that shows
the engine and the HF path score alike (``tests/engine/test_engine_backend.py``).
"""

from __future__ import annotations

from oscarkv.config import ENGINE_METHODS, EngineConfig, EvalConfig, KVConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from oscarkv.eval import tasks as task_lib
from oscarkv.quant.artifact import ModelFingerprint
from oscarkv.quant.codec import KVCodec

EXTRA_TOKENS = 8
"""Tokens generated beyond the gold answer's length (room for a space or a stray token)."""


def answer_budget(answer_tokens: int, prompt_tokens: int, max_len: int | None) -> int:
    """Tokens a free-running answer may generate: the gold answer's length plus :data:`EXTRA_TOKENS`,
    cut to the room the model's maximum length leaves after the prompt (never below the answer's
    length: a task sample's prompt and answer fit its context, ``oscarkv.eval.tasks``)."""
    budget = answer_tokens + EXTRA_TOKENS
    return min(budget, max(answer_tokens, max_len - prompt_tokens)) if max_len else budget


def served(kv: KVConfig) -> bool:
    """Whether ``serve`` can run this configuration, by ``EngineConfig``'s rules: an engine method, a sink of whole
    pages, and low-bit methods only with a recent window (the engine demotes whole pages behind it; at one-token pages
    a sink alone will do)."""
    if kv.method not in ENGINE_METHODS or kv.sink % kv.page_size:
        return False
    return kv.method == "bf16" or kv.recent > 0 or (kv.page_size == 1 and kv.sink > 0)


def engine_for(loaded, kv: KVConfig, artifact, context: int, batch: int) -> LLMEngine:
    """An engine serving ``kv`` for ``batch`` concurrent sequences of up to ``context`` tokens (plus
    room for the question and answer), prefilling in 512-token chunks as ``serve`` does by default."""
    layers, kv_heads, head_dim = ModelFingerprint.from_config(loaded.model.config).kv_dims
    budget = context + 1024
    # batch sequences held entirely in BF16 (K and V, every layer), with room to spare
    memory = batch * 2 * budget * layers * kv_heads * head_dim * 2 * 2
    ecfg = EngineConfig(kv, kv_memory_bytes=memory, max_num_seqs=batch, max_num_batched_tokens=budget,
                        prefill_chunk=512 - 512 % kv.page_size or kv.page_size, enable_prefix_caching=False)
    return LLMEngine.from_hf(loaded.model, ecfg, artifact, loaded.tokenizer)


def build_engines(loaded, codecs: dict[str, KVCodec], cfg: EvalConfig, artifacts) -> dict[str, LLMEngine]:
    """One engine per report label, sized for ``cfg.batch`` sequences of the largest context."""
    engines = {}
    for label, codec in codecs.items():
        kv = codec.config
        if kv.method not in ENGINE_METHODS:
            raise ValueError(f"eval --backend engine serves {ENGINE_METHODS}; {label!r} needs --backend hf")
        name = label.split(":", 1)[1].split("+")[0] if label.startswith("oscar:") else ""
        art = (artifacts or {}).get(name) if kv.method == "oscar" else None
        engines[label] = engine_for(loaded, kv, art, max(cfg.contexts), cfg.batch)
    return engines


def _run(engine: LLMEngine, prompt: list[int], params: SamplingParams, chunk_ends: tuple[int, ...] = ()):
    engine.add_request("eval", prompt, params, chunk_ends=chunk_ends)
    out = None
    while engine.has_unfinished():
        for o in engine.step():
            out = o
    return out


def _run_all(engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]]) -> list:
    """Run ``(prompt, params)`` requests at once to completion; their final outputs, in order."""
    for i, (prompt, params) in enumerate(requests):
        engine.add_request(f"eval-{i}", prompt, params)
    done = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                if o.finish_reason == "error":
                    raise RuntimeError(f"engine request {o.request_id} failed: {o.error}")
                done[o.request_id] = o
    return [done[f"eval-{i}"] for i in range(len(requests))]


def score_free(engine: LLMEngine, prompts: list[list[int]], samples: list[task_lib.Sample],
               answer_tokens: list[int]) -> list[tuple[float, float, str]]:
    """Per sample, run as concurrent requests: (string-match score of the greedy generation, BPE
    of the stored sequence, the text)."""
    outs = _run_all(engine, [(p, SamplingParams(max_tokens=answer_budget(n, len(p), engine.max_model_len), temperature=0))
                             for p, n in zip(prompts, answer_tokens)])
    return [(task_lib.score_text(s, o.text), engine.bpe(len(p) + len(o.token_ids)), o.text)
            for s, p, o in zip(samples, prompts, outs)]


def score_chunked(engine: LLMEngine, prompts: list[list[int]], targets: list[list[int]],
                  spans: list[list[tuple[int, int]]]) -> list[tuple[float, float]]:
    """Teacher-forced through the engine's own chunked prefill, the samples as concurrent requests:
    per sample, (fraction of answer spans predicted exactly, mean NLL of the answer tokens) when
    ``prompt + target`` is prefilled as ``serve`` prefills a prompt, each chunk reading the earlier
    ones as stored. The development objective as served (``oscarkv.eval.objective``)."""
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1, ignore_eos=True)
    outs = _run_all(engine, [(p + t, params) for p, t in zip(prompts, targets)])
    out = []
    for o, prompt, target, sp in zip(outs, prompts, targets, spans):
        rows = o.prompt_logprobs[len(prompt):]  # row j: the distribution of target[j]
        ok = [max(r.items(), key=lambda kv: kv[1])[0] == t for r, t in zip(rows, target)]
        nll = [-r[t] for r, t in zip(rows, target)]
        answer = [x for a, b in sp for x in nll[a:b]]
        out.append((sum(all(ok[a:b]) for a, b in sp) / len(sp), sum(answer) / len(answer)))
    return out


def score_engine(engine: LLMEngine, doc: list[int], question: list[int], target: list[int],
                 spans: list[tuple[int, int]]) -> tuple[float, float]:
    """Teacher-forced on the engine: (fraction of answer spans predicted exactly, BPE of the stored sequence)."""
    prompt = doc + question + target[:-1]
    out = _run(engine, prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1, ignore_eos=True),
               chunk_ends=(len(doc),))
    rows = out.prompt_logprobs + [None]  # row i: distribution of token i given tokens < i
    first = len(doc) + len(question)
    pred = [max(rows[first + j].items(), key=lambda kv: kv[1])[0] for j in range(len(target) - 1)]
    pred.append(out.token_ids[0])  # greedy after the whole prompt: the answer's last token
    ok = [p == t for p, t in zip(pred, target)]
    acc = sum(all(ok[a:b]) for a, b in spans) / len(spans)
    return acc, engine.bpe(len(prompt))
