"""The surface: where the assistant's output reaches the person.

The agent loop never assumes that what it generated was delivered. It hands
text to a surface and later *asks* the surface how much of each message the
person actually got: for the text surface, what was printed; for the voice
surface, the words whose audio has fully played.

Each assistant message is one output unit, named by a `UnitRef` (turn, step,
attempt). A surface drops units of attempts that are no longer current.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # (what a capability is handed; none of these imports a surface)
    from voice.agent.approvals import Answer
    from voice.agent.blocks import ToolCall
    from voice.agent.tools.base import Tool
    from voice.log.events import ToolResult


@dataclass(frozen=True)
class UnitRef:
    conversation: str
    turn: int
    step: int
    attempt: int
    part: int = 0  # 1: text held back until a write's receipt confirmed it

    @property
    def message_id(self) -> str:
        base = f"{self.turn}.{self.step}.{self.attempt}"
        return f"{base}.{self.part}" if self.part else base


@dataclass(frozen=True)
class Delivered:
    """How much of one unit the person got. `text_chars` is a prefix length of
    the unit's text (all its text blocks concatenated); `reasoning_chars`
    likewise for reasoning (0 where reasoning is not shown)."""

    text_chars: int
    reasoning_chars: int = 0
    complete: bool = False
    words: int = 0
    samples: int = 0


class Surface(Protocol):
    #: True when delivery continues after the stream ends (speech playing):
    #: the loop then records `speech/played` for each message it completes.
    tracks_playback: bool

    def open(self, ref: UnitRef) -> None:
        """A new assistant message starts."""

    async def text(self, ref: UnitRef, text: str) -> None:
        """Hand over a piece of the message's text (may queue it)."""

    async def reasoning(self, ref: UnitRef, text: str) -> None:
        """Hand over a piece of reasoning (a surface may ignore it)."""

    async def close(self, ref: UnitRef) -> None:
        """The message has all its text (a voice surface speaks the rest)."""

    def discard(self, ref: UnitRef, reason: str) -> None:
        """The attempt failed: drop what is queued of it and say so."""

    def delivered(self, ref: UnitRef) -> Delivered:
        """How much of the unit has reached the person, right now."""

    async def wait_delivered(self, ref: UnitRef) -> Delivered:
        """Wait until the whole unit has reached the person (cancellable)."""

    async def stop(self) -> None:
        """Barge-in: silence now and drop everything queued. Must finish
        quickly; the loop calls it shielded under a deadline."""

    async def notice(self, text: str) -> None:
        """A message from the assistant itself, not from the model (errors,
        hints). Not part of model history."""


# What a surface may also do. The loop asks `isinstance(surface, <one of these>)`:
# the capability is declared here, so a misspelt one fails type checks, not silently.


@runtime_checkable
class AnswersQuestions(Protocol):
    """The person's next words can answer a question the loop asks before a
    call (voice.agent.approvals): spoken (the voice session routes them) or
    typed (`ReadsAnswers`). False where no one can answer right now."""

    answers_questions: bool


@runtime_checkable
class ReadsAnswers(Protocol):
    """A surface that reads the person's typed answer itself (the terminal):
    the next line, None when the input ended. None: it cannot read now."""

    read_answer: Callable[[], Awaitable[str | None]] | None


@runtime_checkable
class AsksClient(Protocol):
    """A surface whose client asks the person itself (an editor's permission
    dialog, ACP session/request_permission)."""

    async def ask_permission(self, call: ToolCall, tool: Tool, args: dict[str, Any], question: str) -> Answer: ...


@runtime_checkable
class ShowsToolStates(Protocol):
    """A surface that shows tool calls (ACP): pending (the model made it),
    in_progress (dispatched), completed or failed, with what the model saw
    of its result."""

    async def tool_state(self, call: ToolCall, tool: Tool | None, status: str,
                         result: ToolResult | None = None) -> None: ...


@runtime_checkable
class OwesPhrases(Protocol):
    """A surface whose speaker can go away (voice): a phrase announcing an
    outcome that a lost speaker kept from its turn is handed over once the
    turn has ended, and the surface delivers it when it can (said once the
    speaker is back, or written down: voice.speech.audio_loss), never as
    part of the turn. Elsewhere such a phrase is a plain `notice`."""

    def owe(self, text: str) -> None: ...


#: Units (messages) a text or ACP surface keeps what it knows of, the newest:
#: what was delivered of one is read while its turn runs, never after.
KEEP_UNITS = 64


def hold_newest(units: dict, keep: int = KEEP_UNITS) -> None:
    """Let go of the oldest units beyond `keep` (a dict keeps insertion order),
    so a surface that lives for weeks holds a bounded number."""
    while len(units) > keep:
        del units[next(iter(units))]


@dataclass
class ShownUnit:
    """What a surface that shows text as it comes knows of one unit."""
    text_chars: int = 0
    reasoning_chars: int = 0
    closed: bool = False
    stopped: bool = False


class ShowsText:
    """The unit bookkeeping of a surface that shows text as it comes (the
    terminal, an editor): what it has shown is delivered at once."""

    _units: dict[UnitRef, ShownUnit]

    def open(self, ref: UnitRef) -> None:
        self._units[ref] = ShownUnit()
        hold_newest(self._units)

    def delivered(self, ref: UnitRef) -> Delivered:
        unit = self._units.get(ref, ShownUnit())
        return Delivered(unit.text_chars, unit.reasoning_chars, complete=unit.closed)

    async def wait_delivered(self, ref: UnitRef) -> Delivered:
        return self.delivered(ref)  # every piece was shown before text() returned
