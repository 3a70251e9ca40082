"""Token windows of natural text for decode-faithful perplexity (``oscarkv.eval.runner``).

The text is ``eval.txt`` (Shakespeare), never the calibration text. It is tokenized once
per tokenizer and cut into non-overlapping windows of ``length`` tokens: the window grid
starts at a seed-dependent offset and ``n`` of its slots are drawn with the seed, so the
same (tokenizer, length, n, seed) always gives the same windows. Asking for more windows
than the text holds is an error that names the capacity (see :func:`max_windows`), never
a silent overlap.
"""

from __future__ import annotations

import functools
import random

import torch

from oscarkv.data import read_text


@functools.lru_cache(maxsize=4)
def _token_ids(tokenizer) -> torch.Tensor:
    ids = tokenizer(read_text("eval.txt"), add_special_tokens=False).input_ids
    return torch.tensor(ids, dtype=torch.long)  # [T]


def max_windows(tokenizer, length: int) -> int:
    """How many non-overlapping windows of ``length`` tokens ``eval.txt`` holds."""
    if length < 2:
        raise ValueError(f"window length must be >= 2 tokens, got {length}")
    return _token_ids(tokenizer).numel() // length


def text_windows(tokenizer, length: int, n: int, seed: int = 0) -> list[torch.Tensor]:
    """``n`` non-overlapping windows of ``length`` token ids (each ``[length]``, int64), in text order."""
    ids = _token_ids(tokenizer)
    slots = max_windows(tokenizer, length)
    if not 1 <= n <= slots:
        raise ValueError(f"eval.txt holds {ids.numel()} tokens: between 1 and {slots} windows of "
                         f"{length} tokens fit, {n} were asked for")
    rng = random.Random(f"windows/{length}/{seed}")
    shift = rng.randrange(ids.numel() - slots * length + 1)
    chosen = sorted(rng.sample(range(slots), n))
    return [ids[shift + k * length: shift + (k + 1) * length].clone() for k in chosen]
