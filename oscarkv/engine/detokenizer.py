"""Incremental detokenization: each request's output text grows by a few tokens' decode per step.

Role: the engine owns one :class:`Detokenizer` (its tokenizer, and which token ids
``skip_special_tokens`` drops); each :class:`~oscarkv.engine.sequence.Sequence` owns one
:class:`IncrementalText`, fed every sampled token by ``LLMEngine.step``. Its ``text`` always
equals ``tokenizer.decode(output_ids, skip_special_tokens=True)`` cut before the first stop
string — what decoding the whole output at every step gave — at a cost per token that does not
grow with the output (decoding the whole output at every step is quadratic in its length).

Offsets (vLLM's ``detokenize_incrementally``): the kept ids (special ones dropped up front, as
``skip_special_tokens`` drops them before the tokenizer's decoder runs) are decoded in a window
``ids[prefix:]``; the text they add is ``decode(ids[prefix:]) - decode(ids[prefix:read])``. The
window starts one emitted piece back (``prefix``), so a decoder that treats the first token of a
call apart (SentencePiece strips its leading space) sees the same context for both decodes.
While the window's text ends in U+FFFD (an unfinished multi-byte UTF-8 character, or byte
tokens of one), the offsets stay put: that ``tail`` is part of ``text`` (a finished request
reports it as the full decode does) but is not yet final, so a stream holds it back.

Stop strings: a new match can only end in the text added this step, so the search covers that
text plus ``max(len(stop)) - 1`` characters before it (not the whole text); the text is cut
before the match, as before.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class Detokenizer:
    """The engine's tokenizer for incremental decoding (one per engine, shared by its requests)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._skipped: dict[int, bool] = {}  # token id -> dropped by skip_special_tokens

    def skipped(self, token_id: int) -> bool:
        """Whether ``decode(..., skip_special_tokens=True)`` drops ``token_id`` (asked once per id)."""
        hit = self._skipped.get(token_id)
        if hit is None:
            kept = self.tokenizer.decode([token_id], skip_special_tokens=True)
            hit = self._skipped[token_id] = kept == "" and self.tokenizer.decode([token_id]) != ""
        return hit

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class IncrementalText:
    """One request's output text, grown one sampled token at a time (see the module docstring)."""

    def __init__(self, detokenizer: Detokenizer, stop: tuple[str, ...] = ()) -> None:
        self.detok, self.stop = detokenizer, stop
        self.stop_holdback = max((len(s) - 1 for s in stop), default=0)
        self.ids: list[int] = []  # the output ids the text decodes (special ones dropped)
        self.prefix = self.read = 0  # decode window ids[prefix:]; ids[:read] are final text
        self.final = ""  # text of ids[:read]
        self.tail = ""  # text ids[read:] add so far: ends in U+FFFD, or is empty
        self.stopped = False

    @property
    def text(self) -> str:
        return self.final + self.tail

    @property
    def holdback(self) -> int:
        """Characters at the end of ``text`` a stream keeps back while the request runs: the tail,
        and before it a possible beginning of a stop string."""
        return len(self.tail) + self.stop_holdback

    def add(self, token_id: int) -> bool:
        """Append one sampled token; ``True`` if a stop string now ends the text (cut before it)."""
        if self.stopped or self.detok.skipped(token_id):
            return self.stopped
        checked = len(self.final)  # no stop string lies within final[:checked]
        self.ids.append(token_id)
        before = self.detok.decode(self.ids[self.prefix:self.read])
        window = self.detok.decode(self.ids[self.prefix:])
        self.tail = window[len(before):] if len(window) > len(before) else ""
        if self.tail and not self.tail.endswith(REPLACEMENT):
            self.final, self.tail = self.final + self.tail, ""
            self.prefix, self.read = self.read, len(self.ids)
        return self._find_stop(max(0, checked - self.stop_holdback))

    def _find_stop(self, start: int) -> bool:
        """Cut the text before the first stop string that starts at or after ``start``."""
        if not self.stop:
            return False
        window = self.final[start:] + self.tail  # NOTE: a slice, not the whole text: O(new text) per token
        hits = [at for at in (window.find(s) for s in self.stop) if at >= 0]
        if not hits:
            return False
        self.final, self.tail, self.stopped = self.text[:start + min(hits)], "", True
        return True
