"""The event vocabulary of the durable log (docs/EVENTS.md). Imports nothing of ours but its bodies (voice/log/bodies/).

Every row of the log is one `Event`: ids, times, a `type` and a JSON
`payload`. Each type has one frozen dataclass here, its *body*, whose fields
are the payload's keys (`TurnEnd(outcome="aborted")` is the payload
`{"outcome": "aborted"}`). Writers record bodies (`EventStore.record`);
readers get them back with `event.body` (`parse(event)`), tolerant of rows
that earlier versions wrote: a key such a row lacks reads as the field's
default, a key no field names is ignored.

A field made with `optional()` is written only when its writer gives it
(null included): a body knows which of those it was given, so each kind of
row keeps exactly the keys it always had (an interrupted message's
`finish_reason: null`, no `finish_reason` at all on text released after a
receipt). Read back, an absent one holds its default. Where a meaning has
fixed words (a call the turn never ran, a result recovery
closed), the body has one constructor for it, used by every writer.

The three *surface* types are the only ones model history is derived from;
`speech/played` amends an assistant message with how much of it the person
actually heard. docs/EVENTS.md is the table of every type, its fields and
its writers (tests/test_events_doc.py keeps it true).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

# The bodies live by family in voice.log.bodies; this module is the one to import them from.
from voice.log.bodies.base import (BODIES, UNSET, Body, ContentBlock, OpenAIToolCall, Route, TimedDelta, blocks_text,
                                   optional)
from voice.log.bodies.speech import (AudioClock, AudioMuted, AudioUnmuted, DeviceBack, DeviceLost, DevicePinned,
                                     LateOutput, ListenControl, ListenSpeech, ListenWake, ListenWindow, SpeechCleared,
                                     SpeechConfirmed, SpeechOwed, SpeechPaused, SpeechPlayed, SpeechResumed,
                                     SpeechSentence, SystemResumed)
from voice.log.bodies.tool import (ABORTED_BEFORE_DISPATCH, BLOCKED, CONFIRMED, DECLINED, FAILED, UNKNOWN,
                                   ApprovalAnswered, ApprovalRequested, EffectReceipt, TimerCancel, TimerFired,
                                   TimerSet, ToolCalled, ToolDispatched, ToolResult)
from voice.log.bodies.turn import (AcpSession, AssistantAttempt, AssistantMessage, AssistantStream, ConversationEnd,
                                   ConversationFork, ConversationSummary, RequestError, RuntimeRecovery, StepEnd,
                                   StepStart, TurnEnd, TurnStart, UserMessage, UserStop)


class DamagedEvent(ValueError):
    """A row this program cannot read: its payload is not a JSON object, lacks
    a required key, or has a type this program does not know. Only a change
    made outside voice does that (the log is append-only)."""

    def __init__(self, seq: int, type_: str, why: str):
        super().__init__(f"the log has a damaged row: event {seq} ({type_}) {why}; it was changed outside voice: "
                         "restore it from a backup, or give another log with --db")
        self.seq = seq


def parse(event: Event) -> Body:
    """The typed body of a row. Raises DamagedEvent for a type this program
    does not know or a payload without a required key."""
    kind = BODIES.get(event.type)
    if kind is None:
        raise DamagedEvent(event.seq, event.type, "has a type this program does not know")
    try:
        return kind.from_payload(event.payload)
    except (ValueError, TypeError) as exc:
        raise DamagedEvent(event.seq, event.type, f"cannot be read: {exc}") from None


def check_readable(events: list[Event]) -> None:
    """Parse every row's body now (kept on the row, `event.body`): so a row
    damaged outside voice is said in one line before anything is drawn or
    written, not halfway through."""
    for event in events:
        event.body  # (parsed once: kept on the row for the reader)


# -- the type strings, for filters and older call sites ----------------------

TURN_START: Final = TurnStart.TYPE
USER_MESSAGE: Final = UserMessage.TYPE
USER_STOP: Final = UserStop.TYPE
STEP_START: Final = StepStart.TYPE
STEP_END: Final = StepEnd.TYPE
ASSISTANT_STREAM: Final = AssistantStream.TYPE
ASSISTANT_MESSAGE: Final = AssistantMessage.TYPE
ASSISTANT_ATTEMPT: Final = AssistantAttempt.TYPE
REQUEST_ERROR: Final = RequestError.TYPE
TOOL_CALL: Final = ToolCalled.TYPE
TOOL_DISPATCH: Final = ToolDispatched.TYPE
TOOL_RESULT: Final = ToolResult.TYPE
EFFECT_RECEIPT: Final = EffectReceipt.TYPE
SPEECH_PLAYED: Final = SpeechPlayed.TYPE
SPEECH_PAUSED: Final = SpeechPaused.TYPE
SPEECH_RESUMED: Final = SpeechResumed.TYPE
SPEECH_CONFIRMED: Final = SpeechConfirmed.TYPE
SPEECH_CLEARED: Final = SpeechCleared.TYPE
SPEECH_SENTENCE: Final = SpeechSentence.TYPE
AUDIO_CLOCK: Final = AudioClock.TYPE
AUDIO_LOST: Final = DeviceLost.TYPE
AUDIO_BACK: Final = DeviceBack.TYPE
SPEECH_OWED: Final = SpeechOwed.TYPE
AUDIO_PINNED: Final = DevicePinned.TYPE
SYSTEM_RESUMED: Final = SystemResumed.TYPE
AUDIO_MUTED: Final = AudioMuted.TYPE
AUDIO_UNMUTED: Final = AudioUnmuted.TYPE
LISTEN_SPEECH: Final = ListenSpeech.TYPE
LISTEN_WAKE: Final = ListenWake.TYPE
LISTEN_WINDOW: Final = ListenWindow.TYPE
LISTEN_CONTROL: Final = ListenControl.TYPE
LATE_OUTPUT: Final = LateOutput.TYPE
CONVERSATION_FORK: Final = ConversationFork.TYPE
CONVERSATION_END: Final = ConversationEnd.TYPE
CONVERSATION_SUMMARY: Final = ConversationSummary.TYPE
ACP_SESSION: Final = AcpSession.TYPE
TIMER_SET: Final = TimerSet.TYPE
TIMER_CANCEL: Final = TimerCancel.TYPE
TIMER_FIRED: Final = TimerFired.TYPE
RECOVERY: Final = RuntimeRecovery.TYPE
TURN_END: Final = TurnEnd.TYPE
APPROVAL_REQUESTED: Final = ApprovalRequested.TYPE
APPROVAL_ANSWERED: Final = ApprovalAnswered.TYPE

EVENT_TYPES: Final = frozenset(BODIES)
SURFACE_TYPES: Final = frozenset(t for t, b in BODIES.items() if b.SURFACE)
DURABLE_TYPES: Final = frozenset(t for t, b in BODIES.items() if b.DURABLE)

# turn/end outcomes
COMPLETED: Final = "completed"
ABORTED: Final = "aborted"  # the person stopped it
INTERRUPTED: Final = "interrupted"  # crash or shutdown, or the sound card went away (reason AUDIO_LOST)
AUDIO_LOST_REASON: Final = "audio_lost"  # turn/end's reason when the sound card went away mid-turn
OWED_ALOUD: Final = "aloud"  # speech/owed: said once audio was back
OWED_NOTICE: Final = "notice"  # speech/owed: written down only, the idle gap having passed
ERROR: Final = "error"
TURN_OUTCOMES: Final = frozenset({COMPLETED, ABORTED, INTERRUPTED, ERROR})

# tool/result statuses (ABORTED_BEFORE_DISPATCH, BLOCKED, DECLINED) and effect/receipt states
# (CONFIRMED, FAILED, UNKNOWN): voice.log.bodies.tool, imported above.


# -- rows ----------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One row of the log, as read back."""

    seq: int
    conversation: str
    turn: int | None
    step: int | None
    attempt: int | None
    type: str
    payload: dict[str, Any]
    at_mono: float
    at_wall: float

    @property
    def body(self) -> Body:
        """The payload, typed (see `parse`); parsed once per row."""
        body = self.__dict__.get("_body")
        if body is None:
            body = self.__dict__["_body"] = parse(self)
        return body

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "conversation": self.conversation,
            "turn": self.turn,
            "step": self.step,
            "attempt": self.attempt,
            "type": self.type,
            "payload": self.payload,
            "at_mono": self.at_mono,
            "at_wall": self.at_wall,
        }


def encode_payload(payload: dict[str, Any]) -> str:
    """JSON with no NaN and no silent coercion: a payload that is not plain
    JSON (or text that is not valid Unicode, such as a lone surrogate, which
    SQLite cannot store as UTF-8) is a bug at the caller, reported before
    anything is written."""
    try:
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        text.encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise ValueError(f"event payload is not JSON-serialisable: {exc}") from exc
    return text
