"""The synthetic-task evaluation through the paged engine (``oscarkv eval --backend engine``).

Role: the same protocol as :func:`oscarkv.eval.runner.run_tasks`, but every sample runs on
the serving path with real packed pages: one request per (sample, KV method) whose prompt is
``document + question + answer[:-1]`` with an explicit chunk end after the document — so the
document is prefilled at full precision and stored per method, and the question and
teacher-forced answer form the next chunk, attending to the document as stored (exactly the
HF path's two chunks). ``prompt_logprobs=1`` returns, per position, the argmax; an answer span
counts when every one of its tokens is the argmax. The same samples (same seed) are scored,
so the two backends agree within floating-point noise.

Records go to :class:`oscarkv.eval.runner.Tally` like the HF path's. Methods the engine does
not serve (``int4``, ``kivi``) raise a clear error.
"""

from __future__ import annotations

from oscarkv.config import ENGINE_METHODS, EngineConfig, EvalConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from oscarkv.eval import tasks as task_lib
from oscarkv.eval.samples import answer_spans, task_samples
from oscarkv.quant.codec import KVCodec


def build_engines(loaded, codecs: dict[str, KVCodec], cfg: EvalConfig, artifacts) -> dict[str, LLMEngine]:
    """One engine per report label, sized for one sequence of the largest context."""
    engines = {}
    for label, codec in codecs.items():
        kv = codec.config
        if kv.method not in ENGINE_METHODS:
            raise ValueError(f"eval --backend engine serves {ENGINE_METHODS}; {label!r} needs --backend hf")
        name = label.split(":", 1)[1].split("+")[0] if label.startswith("oscar:") else ""
        art = (artifacts or {}).get(name) if kv.method == "oscar" else None
        budget = max(cfg.contexts) + 1024
        ecfg = EngineConfig(kv, kv_memory_bytes=1 << 30, max_num_seqs=1, max_num_batched_tokens=budget,
                            prefill_chunk=512 - 512 % kv.page_size or kv.page_size, enable_prefix_caching=False)
        engines[label] = LLMEngine.from_hf(loaded.model, ecfg, art, loaded.tokenizer)
    return engines


def score_engine(engine: LLMEngine, doc: list[int], question: list[int], target: list[int],
                 spans: list[tuple[int, int]]) -> tuple[float, float]:
    """(fraction of answer spans predicted exactly, BPE of the stored sequence)."""
    prompt = doc + question + target[:-1]
    engine.add_request("eval", prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1,
                                                      ignore_eos=True), chunk_ends=(len(doc),))
    out = None
    while engine.has_unfinished():
        for o in engine.step():
            out = o
    rows = out.prompt_logprobs + [None]  # row i: distribution of token i given tokens < i
    first = len(doc) + len(question)
    pred = [max(rows[first + j].items(), key=lambda kv: kv[1])[0] for j in range(len(target) - 1)]
    pred.append(out.token_ids[0])  # greedy after the whole prompt: the answer's last token
    ok = [p == t for p, t in zip(pred, target)]
    acc = sum(all(ok[a:b]) for a, b in spans) / len(spans)
    return acc, engine.bpe(len(prompt))


def run_tasks_engine(loaded, codecs: dict[str, KVCodec], cfg: EvalConfig, artifacts, bar, tally) -> list[dict]:

    engines = build_engines(loaded, codecs, cfg, artifacts)
    tok = loaded.tokenizer
    for ctx in cfg.contexts:
        for task in (t for t in cfg.tasks if t != "ppl"):
            for sample in task_samples(loaded, task, ctx, cfg):
                doc = tok(sample.document, add_special_tokens=False).input_ids
                q = tok(sample.question, add_special_tokens=False).input_ids
                target, spans = answer_spans(tok, task_lib.answer_target(sample), sample.answers)
                for label, engine in engines.items():
                    acc, bpe = score_engine(engine, doc, q, target[0].tolist(), spans)
                    tally.add((label, task, ctx), acc, bpe)
                bar.update(len(engines))
    return tally.records("accuracy")
