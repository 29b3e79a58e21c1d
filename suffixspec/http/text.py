"""Committed tokens to text, incrementally, for streaming.

Contract of `TextAssembler(decode, stops, eos)`:

* `feed(tokens) -> str`: the tokens one round committed; returns the text that may be sent now. The
  whole output is decoded each time and the new suffix is emitted, except (1) trailing U+FFFD
  characters (an incomplete multi-byte character: its remaining bytes come in a later token) and
  (2) a tail that could be the start of one of the `stops` strings (held back until it resolves).
* `finish(reason, tokens=()) -> str`: the rest of the text once the request has ended (`tokens`: the
  last round's, which come with the end): an end-of-sequence token that ended it (`reason` "eos") is
  not text; the text is cut before the first stop string (never sent, `feed` included). Joined, every piece `feed` and `finish` returned equals `text()`.
* `text()`: the final text (after `finish`), `tokens`: every committed token.
"""

from __future__ import annotations

from typing import Callable, Iterable

__all__ = ["TextAssembler"]

REPLACEMENT = "\ufffd"


class TextAssembler:
    def __init__(self, decode: Callable[[list[int]], str], stops: Iterable[str] = (), eos: Iterable[int] = ()):
        self._decode = decode
        self.stops = [s for s in stops if s]
        self.eos = frozenset(int(t) for t in eos)
        self.tokens: list[int] = []
        self._sent = ""
        self._final: str | None = None

    def _hold(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:k]):
                    best = k
                    break
        return best

    def _emit(self, text: str) -> str:
        """The part of `text` beyond what was sent. A decoder that rewrote earlier text (rare: clean-up
        of spaces) cannot take it back: what was sent stays, the text beyond its length follows."""
        new = text[len(self._sent):]
        self._sent += new
        return new

    def feed(self, tokens) -> str:
        self.tokens.extend(int(t) for t in tokens)
        text = self._decode(self.tokens)
        safe = self._cut(text.rstrip(REPLACEMENT))
        safe = safe[: len(safe) - self._hold(safe)]
        if len(safe) <= len(self._sent):
            return ""
        return self._emit(safe)

    def _cut(self, text: str) -> str:
        """`text` up to its first stop string (all of it when there is none)."""
        if not self.stops:
            return text
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        return text if cut < 0 else text[:cut]

    def finish(self, reason: str, tokens=()) -> str:
        """`tokens`: the last round's tokens, when they come with the end (the EOS token among them)."""
        self.tokens.extend(int(t) for t in tokens)
        tokens = self.tokens
        if reason == "eos" and tokens and tokens[-1] in self.eos:
            tokens = tokens[:-1]
        text = self._cut(self._decode(tokens))
        if len(text) < len(self._sent):  # never retract what was sent
            text = self._sent
        new = self._emit(text)
        self._final = self._sent
        return new

    def text(self) -> str:
        return self._final if self._final is not None else self._sent
