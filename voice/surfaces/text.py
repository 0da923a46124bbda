"""The text surface: replies stream to a terminal (or any text stream).

Delivered = printed: every piece is written and flushed before `text()`
returns, so at any cancellation point the printed text is exactly the
delivered prefix.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TextIO

from voice.agent.surface import Delivered, ShownUnit, ShowsText, UnitRef


@dataclass
class TextSurface(ShowsText):
    out: TextIO = field(default_factory=lambda: sys.stdout)
    label: str = "assistant: "
    show_reasoning: bool = True
    tracks_playback: bool = False
    # The person's next line, when the terminal can answer a question (voice chat sets it):
    # a call that needs their approval asks here (voice.agent.approvals).
    read_answer: Callable[[], Awaitable[str | None]] | None = None
    _units: dict[UnitRef, ShownUnit] = field(default_factory=dict)
    _line_open: bool = False
    _kind: str | None = None  # what the open line shows: "text" or "reasoning"

    @property
    def answers_questions(self) -> bool:
        return self.read_answer is not None

    def _write(self, s: str) -> None:
        self.out.write(s)
        self.out.flush()

    def _start_line(self, kind: str) -> None:
        if self._line_open and self._kind == kind:
            return
        self._end_line()
        self._write(self.label if kind == "text" else "(thinking) ")
        self._line_open, self._kind = True, kind

    def _end_line(self) -> None:
        if self._line_open:
            self._write("\n")
            self._line_open, self._kind = False, None

    async def text(self, ref: UnitRef, text: str) -> None:
        unit = self._units[ref]
        if not text:
            return
        at_line_start = not (self._line_open and self._kind == "text")
        self._start_line("text")
        # Leading whitespace at the start of a line is not shown, yet it is
        # part of the message's text prefix, so it counts as delivered.
        self._write(text.lstrip() if at_line_start else text)
        unit.text_chars += len(text)

    async def reasoning(self, ref: UnitRef, text: str) -> None:
        if not self.show_reasoning or not text:
            return
        self._start_line("reasoning")
        self._write(text)
        self._units[ref].reasoning_chars += len(text)

    async def close(self, ref: UnitRef) -> None:
        self._units[ref].closed = True
        self._end_line()

    def discard(self, ref: UnitRef, reason: str) -> None:
        if self._line_open:
            self._write(f" [{reason}]")
        self._end_line()

    async def stop(self) -> None:
        if self._line_open:
            self._write(" [stopped]")
        self._end_line()

    async def notice(self, text: str) -> None:
        self._end_line()
        self._write(f"[{text}]\n")
