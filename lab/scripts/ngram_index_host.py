"""Host cost of prompt lookup (``speculative.NgramIndex``) against the dictionary index it replaced (eighteenth
session): the first lookup of a sequence (the whole prompt indexed) and one lookup a token after it, at 6K, 32K
and 100K tokens of random ids. Any machine; the GPU host's figures are the ones users see.

    python -m lab.scripts.ngram_index_host
"""

from __future__ import annotations

import random
import time

from oscarkv.engine.speculative import NgramIndex


class DictIndex:
    """The index before 2026-11-28: every n-gram's last position in a dictionary, filled a token at a time."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(lo, hi + 1)}
        self.indexed = 1

    def propose(self, tokens: list[int], k: int) -> list[int]:
        for e in range(self.indexed, len(tokens)):
            for n, last in self.last.items():
                if e >= n:
                    last[tuple(tokens[e - n:e])] = e
        self.indexed = max(self.indexed, len(tokens))
        L = len(tokens)
        for n in range(min(self.hi, L - 1), self.lo - 1, -1):
            e = self.last[n].get(tuple(tokens[L - n:]))
            if e is not None:
                return tokens[e:e + k]
        return []


def main() -> None:
    random.seed(0)
    for L in (6144, 32768, 102400):
        prompt = [random.randrange(49152) for _ in range(L)]
        for name, cls in (("dict", DictIndex), ("scan", NgramIndex)):
            tokens, index = prompt[:], cls(1, 4)
            start = time.perf_counter()
            index.propose(tokens, 4)
            first, start = time.perf_counter() - start, time.perf_counter()
            for _ in range(200):
                tokens.append(random.randrange(49152))
                index.propose(tokens, 4)
            print(f"ngram host L={L} {name}: first lookup {first * 1e3:.2f} ms, "
                  f"then {(time.perf_counter() - start) / 200 * 1e6:.1f} us")


if __name__ == "__main__":
    main()
