"""The evaluation samples of a task and the answer tokens each is scored on.

Shared by both task backends (``oscarkv.eval.runner`` over transformers + ``OscarCache``, and
``oscarkv.eval.engine_backend`` over the paged engine), so that both score the same tokens.
"""

from __future__ import annotations

import torch

from oscarkv.config import EvalConfig
from oscarkv.eval import tasks as task_lib


def task_samples(loaded, task: str, context: int, cfg: EvalConfig) -> list[task_lib.Sample]:
    """The samples of ``task`` at ``context``: prompt and answer within the model's positions."""
    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    return task_lib.generate(task, context, cfg.samples, loaded.tokenizer, seed=cfg.seed, haystack=cfg.haystack,
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
