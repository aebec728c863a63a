"""The output text: UTF-8 decoding across tokens and stop strings."""

from __future__ import annotations

import codecs
from typing import Callable


class Text:
    """The output text: tokens decoded as UTF-8 (a character split across tokens is emitted once whole), cut at
    the first stop string. Text that could still be the start of a stop string is held back from the pieces
    until the next tokens tell; the tokens that begin at or after the stop string's start are dropped, however
    the steps grouped them, so every mode ends on the same tokens."""

    def __init__(self, piece: Callable[[int], bytes], stops: tuple[str, ...]):
        self._piece = piece
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._stops = tuple(x for x in stops if x)
        self._longest = max((len(x) for x in self._stops), default=0)
        self.text = ""
        self._starts: list[int] = []  # where each kept token's text begins
        self._shown = 0  # characters of `text` handed out as pieces
        self.stopped = False

    def add(self, tokens: list[int], final: bool) -> tuple[list[str], int]:
        """Decode `tokens`; return what each of them that is kept shows now, and how many tokens (of these and,
        when a stop string began in an earlier step, of those too) begin at or after a stop string and are
        dropped. `final`: no tokens follow, so nothing is held back."""
        before, first = len(self.text), len(self._starts)  # first: index of this step's first token
        for t in tokens:
            self._starts.append(len(self.text))
            self.text += self._utf8.decode(self._piece(t))
        dropped = 0
        if self._stops:
            hits = [i for i in (self.text.find(x, max(0, before - self._longest)) for x in self._stops) if i >= 0]
            if hits:
                cut = min(hits)
                self.text, self.stopped = self.text[:cut], True
                dropped = sum(1 for s in self._starts if s >= cut)
                del self._starts[len(self._starts) - dropped:]
        visible = len(self.text) if final or self.stopped else len(self.text) - self._held_back()
        pieces = []
        for i in range(first, len(self._starts)):  # this step's tokens that are kept
            end = self._starts[i + 1] if i + 1 < len(self._starts) else len(self.text)
            upto = max(self._shown, min(end, visible))
            pieces.append(self.text[self._shown:upto])
            self._shown = upto
        return pieces, dropped

    def _held_back(self) -> int:
        """How many characters at the end of the text could begin a stop string."""
        for n in range(min(self._longest - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(x.startswith(tail) for x in self._stops):
                return n
        return 0

    def finish(self) -> str:
        """The whole text; a character left incomplete by the last token is flushed unless a stop cut it off."""
        return self.text if self.stopped else self.text + self._utf8.decode(b"", final=True)



def cut_at_stop(new: list[int], n_acc: int, n_draft: int, past_stop: int) -> tuple[list[int], int, int, int]:
    """A step's tokens, accepted and drafted counts without the `past_stop` tokens that begin at or after a stop
    string (accepted drafts past it count as never drafted), and how many of those were earlier steps' tokens."""
    here = min(past_stop, len(new))
    cut = max(0, n_acc - (len(new) - here))
    return new[: len(new) - here], n_acc - cut, n_draft - cut, past_stop - here
