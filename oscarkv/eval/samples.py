"""The evaluation samples of a task, the answer tokens each is scored on, and where its needles lie.

Shared by both task backends (``oscarkv.eval.runner`` over transformers + ``OscarCache``, and
``oscarkv.eval.engine_backend`` over the paged engine), so that both score the same tokens.
"""

from __future__ import annotations

import torch

from oscarkv.config import EvalConfig, KVConfig
from oscarkv.eval import tasks as task_lib


def task_samples(loaded, task: str, context: int, cfg: EvalConfig, haystack: str) -> list[task_lib.Sample]:
    """The samples of ``task`` at ``context`` on ``haystack``: prompt and answer within the model's positions."""
    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    return task_lib.generate(task, context, cfg.samples, loaded.tokenizer, seed=cfg.seed, haystack=haystack,
                             limit=limit)


def answer_spans(tokenizer, target: str, answers: tuple[str, ...]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Token ids of ``target`` and, per answer, the token range covering its characters."""
    enc = tokenizer(target, add_special_tokens=False, return_offsets_mapping=True)
    offsets, spans, cursor = enc["offset_mapping"], [], 0
    for ans in answers:
        a = target.index(ans, cursor)
        b, cursor = a + len(ans), a + len(ans)
        toks = [i for i, (s, e) in enumerate(offsets) if s < b and e > a]
        spans.append((toks[0], toks[-1] + 1))
    return torch.tensor([enc["input_ids"]]), spans


def needle_place(tokenizer, sample: task_lib.Sample, kv: KVConfig) -> str:
    """``"window"`` when every gold answer's first occurrence in the document lies in the BF16
    tiers at the end of the prompt (the first ``kv.sink`` or the last ``kv.recent`` prompt
    tokens, which a windowed cache holds in BF16 when generation starts), else ``"history"``
    (low-bit storage for a windowed low-bit method)."""
    enc = tokenizer(sample.document, add_special_tokens=False, return_offsets_mapping=True)
    n = len(enc["input_ids"]) + len(tokenizer(sample.question, add_special_tokens=False).input_ids)
    for ans in sample.answers:
        a = sample.document.index(ans)
        first = next(i for i, (s, e) in enumerate(enc["offset_mapping"]) if e > a)
        last = next(i for i, (s, e) in enumerate(enc["offset_mapping"]) if e >= a + len(ans))
        if not (last < kv.sink or first >= n - kv.recent):
            return "history"
    return "window"
