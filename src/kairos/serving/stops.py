"""Stop sequences over streamed text: emit what cannot be the start of a stop, hold the rest.

m = StopMatcher(("\\n\\n",))
m.feed("a\\n") -> ("a", False); m.feed("\\nb") -> ("", True)
"""

from __future__ import annotations


class StopMatcher:
    """Feed generated pieces; get back the text that is safe to send and whether a stop hit."""

    __slots__ = ("_emitted", "_longest", "_stops", "_text")

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._text = ""
        self._emitted = 0

    @property
    def text(self) -> str:
        """Everything sent so far (the stop sequence itself is never part of it)."""
        return self._text[: self._emitted]

    def feed(self, piece: str) -> tuple[str, bool]:
        """Add `piece`; return (text now safe to send, True when a stop sequence ended it)."""
        self._text += piece
        if not self._stops:
            return self._take(len(self._text)), False
        start = max(0, self._emitted - self._longest + 1)
        hits = [i for i in (self._text.find(s, start) for s in self._stops) if i >= 0]
        if hits:
            end = min(hits)
            self._text = self._text[:end]
            return self._take(end), True
        return self._take(len(self._text) - self._held()), False

    def flush(self) -> str:
        """At the end of generation: what was held back as a possible stop prefix."""
        return self._take(len(self._text))

    def _held(self) -> int:
        # the longest tail of the text that is a proper prefix of some stop sequence
        tail = self._text[max(self._emitted, len(self._text) - self._longest + 1) :]
        for n in range(len(tail), 0, -1):
            if any(s.startswith(tail[-n:]) for s in self._stops):
                return n
        return 0

    def _take(self, end: int) -> str:
        piece = self._text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        return piece
