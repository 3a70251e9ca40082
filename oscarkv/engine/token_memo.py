"""Token ids of a text that repeats an earlier one: a chat's follow-up turn encodes only what is new.

Role: the text → token ids step of :meth:`LLMEngine.validate <oscarkv.engine.engine.LLMEngine.validate>` and of the
server's completions and chat endpoints. A client of a chat API sends the whole conversation every turn: over a
cached 100K-token document, tokenizing it again took ~190 ms a turn on a CPU core (the default model's tokenizer,
126K tokens), where the engine's first step takes 6-30 ms.

Why a cut is exact: a fast (Rust) tokenizer splits its input at every added token (``<|im_start|>``,
``<|start_header_id|>``, … — what chat templates mark turns with) before it normalizes, pre-tokenizes and runs its
model on each piece between them, so the tokens before an added token depend on nothing after it. A new text that
repeats a held text up to the longest added token's length past the start of such a token (a match there, or one
overlapping it, is then decided the same way) takes the held ids before that token and encodes the rest alone,
with no special tokens of its own (the held ids have any the tokenizer puts first). :class:`TokenMemo` cuts only where a tokenizer
passes a probe of exactly that (:func:`cuts_exactly`), and where its special tokens go only in front.

Line starts too, for byte-level BPE tokenizers whose pre-tokenizer is a regex split of GPT-2's, Llama 3's or Qwen's
kind (:func:`_isolates_lines`) over unnormalized (or NFC) text: there every piece holding a newline is whitespace
(or punctuation ending in newlines), so the first non-space character after a newline starts a piece, and no
token of the vocabulary joins a newline to a following non-space byte, so no merge crosses it. So a question asked again over a document sent as plain text (``/v1/completions``,
or a new chat whose one message holds the document) re-encodes from the last kept line start before the texts part
(one every ``LINE_GAP`` characters), not the document. Probed as well (:func:`lines_exactly`).
"""

from __future__ import annotations

import bisect
import json
import re
import threading
from dataclasses import dataclass

MIN_CHARS = 4096
"""Texts shorter than this are encoded whole (a cut saves nothing worth the bookkeeping)."""
LINE_GAP = 2048
"""Characters between the line starts a held text keeps as cuts: a cut re-encodes at most about this much of the
text two requests share."""


@dataclass(frozen=True)
class _Held:
    text: str
    ids: list[int]
    cuts: tuple[tuple[int, int], ...]
    """``(char, token)`` for each added token of ``ids`` (a token that encodes text) and kept line start, in order:
    where a later text may cut."""


class TokenMemo:
    """``encode(text)`` as ``tokenizer(text).input_ids``, reusing the ids of the last texts encoded (per
    ``add_special_tokens``: at most ``size`` of them and ``max_tokens`` ids, so a server's many conversations each
    keep their last turn) up to their last added token that a new text repeats (module docstring). Thread-safe (a
    server tokenizes on worker threads); ``reused``: tokens taken from held texts instead of encoded."""

    def __init__(self, tokenizer, size: int = 64, max_tokens: int = 1 << 21) -> None:
        self.tokenizer, self.size, self.max_tokens = tokenizer, size, max_tokens
        added = _raw_added(tokenizer)
        self.added_ids = frozenset(added.values())
        # NOTE: the longest added token (a match overlapping the cut ends inside the shared text), one character
        # more where a token matches as a single word only (its match reads the character after it)
        words = any(getattr(t, "single_word", False) for t in tokenizer.added_tokens_decoder.values()) if added else 0
        self.reach = max(map(len, added), default=0) + words
        self._held: dict[bool, list[_Held]] = {True: [], False: []}
        self._lock = threading.Lock()
        self.reused = 0
        self.at_added, self.lines = bool(self.added_ids), False  # NOTE: each kind of cut probed alone
        self.at_added = self.at_added and _probe(self, cuts_exactly)
        self.lines = _isolates_lines(tokenizer) and _probe(self, lines_exactly)
        self.enabled = self.at_added or self.lines

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of ``text`` (exactly ``tokenizer(text, add_special_tokens=...).input_ids``)."""
        if not self.enabled or len(text) < MIN_CHARS or (add_special_tokens and not self._front_only()):
            return whole_ids(self.tokenizer, text, add_special_tokens)
        with self._lock:
            held = list(self._held[add_special_tokens])
        cut = None
        for h in reversed(held):  # NOTE: the newest first; a cut past half the text will do
            if (c := _cut(h, text, self.reach)) and (cut is None or c[1] > cut[1]):
                cut = c
                if 2 * c[2] >= len(text):
                    break
        entry = self._extend(text, *cut) if cut else self._whole(text, add_special_tokens)
        with self._lock:
            kept = [h for h in self._held[add_special_tokens] if not text.startswith(h.text)] + [entry]
            while len(kept) > 1 and (len(kept) > self.size or sum(len(h.ids) for h in kept) > self.max_tokens):
                kept.pop(0)  # NOTE: the oldest first
            self._held[add_special_tokens] = kept
            self.reused += cut[1] if cut else 0
        return list(entry.ids)

    def _whole(self, text: str, add_special_tokens: bool) -> _Held:
        enc = self.tokenizer(text, add_special_tokens=add_special_tokens)
        return _Held(text, enc.input_ids, self._cuts(text, enc, 0, 0))

    def _extend(self, text: str, held: _Held, j: int, p: int) -> _Held:
        """``held``'s ids before its token ``j`` (at character ``p``), then ``text[p:]`` encoded alone."""
        enc = self.tokenizer(text[p:], add_special_tokens=False)
        cuts = tuple(c for c in held.cuts if c[1] < j) + self._cuts(text[p:], enc, p, j)
        return _Held(text, held.ids[:j] + enc.input_ids, cuts)

    def _cuts(self, text: str, enc, char0: int, token0: int) -> tuple[tuple[int, int], ...]:
        """The cuts of ``enc``, the encoding of ``text`` (at character ``char0``, token ``token0`` of a held text)."""
        out = []
        if self.at_added:
            for k, t in enumerate(enc.input_ids):
                if t in self.added_ids and (span := enc.token_to_chars(k)) is not None:
                    out.append((char0 + span.start, token0 + k))
        if self.lines:
            out += ((char0 + c, token0 + k) for c, k in _line_starts(text, enc, LINE_GAP))
        return tuple(sorted(out))

    def _front_only(self) -> bool:
        """Whether the tokenizer's own special tokens (``add_special_tokens``) all go before the text's."""
        if not hasattr(self, "_front"):
            bare = self.tokenizer("a b", add_special_tokens=False).input_ids
            full = self.tokenizer("a b", add_special_tokens=True).input_ids
            self._front = full[len(full) - len(bare):] == bare
        return self._front


def whole_ids(tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    """``tokenizer(text).input_ids``, passing ``add_special_tokens`` only when off (a tokenizer-like callable need
    not take it)."""
    return (tokenizer(text) if add_special_tokens else tokenizer(text, add_special_tokens=False)).input_ids


def _raw_added(tokenizer) -> dict[str, int]:
    """The added tokens a fast tokenizer matches in the raw text, before normalizing (``normalized=False``): the
    splits a cut may use (a normalized one is matched inside pieces that a normalizer may prefix)."""
    if not getattr(tokenizer, "is_fast", False):
        return {}
    tokens = getattr(tokenizer, "added_tokens_decoder", {})
    return {t.content: i for i, t in tokens.items() if not getattr(t, "normalized", True)}


def _line_starts(text: str, enc, gap: int) -> list[tuple[int, int]]:
    """``(char, token)`` of line starts of ``text`` (a character after a newline that is not whitespace, where a
    token of its encoding ``enc`` starts), about ``gap`` characters apart."""
    out, i = [], text.find("\n", gap)
    while 0 <= i < len(text) - 1:
        c = i + 1
        if not text[c].isspace() and (k := enc.char_to_token(c)) is not None and enc.token_to_chars(k).start == c:
            out.append((c, k))
            i = text.find("\n", c + gap)
        else:
            i = text.find("\n", c)
    return out


def _isolates_lines(tokenizer) -> bool:
    """Whether ``tokenizer`` is a byte-level BPE over unnormalized or NFC text whose pieces are GPT-2's regex
    (ByteLevel's own) or Split patterns of Llama 3's and Qwen's kind (whitespace runs as ``\\s+(?!\\S)``), Digits
    beside them, so that a line's first non-space character starts a piece; and no token of its vocabulary holds a
    newline followed by anything but whitespace, so that no merge joins a line start to what precedes it."""
    try:  # NOTE: the parts' own states, not the whole tokenizer's JSON (its merges: megabytes at start-up)
        bt = tokenizer.backend_tokenizer
        norm, pre = (json.loads(p.__getstate__()) if p is not None else None for p in (bt.normalizer, bt.pre_tokenizer))
        model, vocab = type(bt.model).__name__, bt.get_vocab(with_added_tokens=False)
    except Exception:  # NOTE: not a fast tokenizer (or a fake one): no line cuts
        return False
    pre = pre or {}
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    byte = [p for p in parts if p.get("type") == "ByteLevel"]
    splits = [str((p.get("pattern") or {}).get("Regex", "")) for p in parts if p.get("type") == "Split"]
    regex = all(r"\s+(?!\S)" in s for s in splits) if splits else all(p.get("use_regex") for p in byte)
    return (model == "BPE" and (norm is None or norm.get("type") == "NFC") and bool(byte)
            and regex and {p.get("type") for p in parts} <= {"Split", "ByteLevel", "Digits"}
            and not any(p.get("add_prefix_space") for p in byte) and not any(map(_LINE_JOIN.search, vocab)))


_LINE_JOIN = re.compile("\u010a[^\u0120\u0109\u010a\u010d\u010b\u010c]")
"""A byte-level token with a newline (``Ċ``) followed by a byte other than whitespace (space, tab, ``\\n``, ``\\r``,
``\\v``, ``\\f`` in GPT-2's byte-to-character map)."""


def _cut(held: _Held, text: str, reach: int) -> tuple[_Held, int, int] | None:
    """``(held, token, char)``: the last cut of ``held`` (not at its first token) that ``text`` repeats with the
    ``reach`` characters from it (at least one); ``None`` if none."""
    i = bisect.bisect_right(held.cuts, common_prefix(held.text, text) - max(reach, 1), key=lambda c: c[0])
    return (held, held.cuts[i - 1][1], held.cuts[i - 1][0]) if i and held.cuts[i - 1][1] > 0 else None


def common_prefix(a, b, block: int = 4096) -> int:
    """How many leading items two sequences (strings, tuples) share: blocks that double in size, then halves of
    the block that differs (C speed; a difference early costs little)."""
    n, lo = min(len(a), len(b)), 0
    while lo < n:
        hi = min(lo + block, n)
        if a[lo:hi] != b[lo:hi]:
            break
        lo, block = hi, 2 * block
    else:
        return n
    while hi - lo > 1:  # a[:lo] equal; they differ before hi
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[lo:mid] == b[lo:mid] else (lo, mid)
    return lo


_PROBE = ("The first turn names a town; the harbour of Aberdour lies east. ", " and a second line, with 3 numbers: 1, 22, 333.\n")


def _probe(memo: TokenMemo, probe) -> bool:
    """``probe(memo)``, ``False`` where the probe itself fails (a tokenizer that only looks fast)."""
    try:
        return probe(memo)
    except Exception:  # NOTE: any failure of a third-party tokenizer: encode whole texts, never refuse to start
        return False


def lines_exactly(memo: TokenMemo) -> bool:
    """Whether cutting at a line start gives ``memo.tokenizer``'s own ids on probe texts: lines ending in letters,
    spaces, punctuation, digits, ``\r`` or another newline, the next line starting with letters, digits, brackets,
    quotes, an apostrophe, accented and non-Latin letters; with special tokens too where they all go in front."""
    tok, kinds = memo.tokenizer, (False, True) if memo._front_only() else (False,)
    for end in ("", " ", "  ", ".", ":", "\n", "\r", "9", "é"):
        for first in ("Harbour", "3 boats", "(east)", "- a", "é", "'s x", "“q”", "Ωμ", "$1", "\u4e2d\u6587"):
            head, c = _PROBE[0] + end + "\n", len(_PROBE[0] + end) + 1
            text = head + first + _PROBE[1]
            for special in kinds:
                held = tok(head + first + " lies east", add_special_tokens=special)
                k = held.char_to_token(c)
                if k is None or held.token_to_chars(k).start != c:
                    return False
                cut = held.input_ids[:k] + tok(text[c:], add_special_tokens=False).input_ids
                if cut != tok(text, add_special_tokens=special).input_ids:
                    return False
    return True


def cuts_exactly(memo: TokenMemo) -> bool:
    """Whether cutting at added tokens gives ``memo.tokenizer``'s own ids on probe texts: each added token (the chat
    template's first) after plain text, a space and a newline, the texts differing three characters after it
    (``False``: encode whole texts); with the tokenizer's special tokens too where they all go in front."""
    tok = memo.tokenizer
    names = sorted(_raw_added(tok), key=lambda n: (n not in (getattr(tok, "chat_template", None) or ""), n))
    for name in names[:24]:
        for glue, special in ((g, s) for g in ("", " ", "\n") for s in (False, True) if not s or memo._front_only()):
            head = _PROBE[0] * 2 + glue + name
            held = memo._whole(head + _PROBE[1], special)
            text = head + _PROBE[1][:3] + name + _PROBE[0]
            cut = next(((j, p) for p, j in reversed(held.cuts) if j > 0 and p + len(name) < len(head) + 3), None)
            if cut is not None and memo._extend(text, held, *cut).ids != tok(text, add_special_tokens=special).input_ids:
                return False
    return True
