"""The event vocabulary of the durable log (docs/ARCHITECTURE.md, "The log"). Imports nothing of ours.

Every row of the log is one `Event`. The three *surface* types are the only
ones model history is derived from; `speech/played` amends an assistant
message with how much of it the person actually heard.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

TURN_START: Final = "turn/start"
USER_MESSAGE: Final = "user/message"
# What the person said that stopped the assistant and asked for nothing more
# (a stop intent, or a backchannel that had cut the reply): not a surface
# event, so never model history; filed under the turn it stopped (or none).
USER_STOP: Final = "user/stop"
STEP_START: Final = "step/start"
STEP_END: Final = "step/end"
ASSISTANT_STREAM: Final = "agent/assistant-stream"
ASSISTANT_MESSAGE: Final = "assistant/message"
ASSISTANT_ATTEMPT: Final = "assistant/attempt"
REQUEST_ERROR: Final = "agent/request-error"
TOOL_CALL: Final = "tool/call"
TOOL_DISPATCH: Final = "tool/dispatch"
TOOL_RESULT: Final = "tool/result"
EFFECT_RECEIPT: Final = "effect/receipt"
SPEECH_PLAYED: Final = "speech/played"
SPEECH_PAUSED: Final = "speech/paused"  # speech onset paused the output; not yet a stop
SPEECH_RESUMED: Final = "speech/resumed"  # it was not a barge-in: playback went on
LATE_OUTPUT: Final = "late/output"
CONVERSATION_FORK: Final = "conversation/fork"
TIMER_SET: Final = "timer/set"
TIMER_CANCEL: Final = "timer/cancel"
TIMER_FIRED: Final = "timer/fired"
RECOVERY: Final = "runtime/recovery"
TURN_END: Final = "turn/end"

EVENT_TYPES: Final = frozenset(
    {
        TURN_START, USER_MESSAGE, USER_STOP, STEP_START, STEP_END, ASSISTANT_STREAM,
        ASSISTANT_MESSAGE, ASSISTANT_ATTEMPT, REQUEST_ERROR, TOOL_CALL,
        TOOL_DISPATCH, TOOL_RESULT, EFFECT_RECEIPT, SPEECH_PLAYED, SPEECH_PAUSED, SPEECH_RESUMED, LATE_OUTPUT,
        CONVERSATION_FORK, TURN_END, TIMER_SET, TIMER_CANCEL, TIMER_FIRED, RECOVERY,
    }
)

SURFACE_TYPES: Final = frozenset({USER_MESSAGE, ASSISTANT_MESSAGE, TOOL_RESULT})

# Committed with an fsync (synchronous=FULL): an effect in the world starts
# only once its dispatch (and so every event before it) is on disk, and what
# is known of it afterwards (receipt, timer, the turn's end) survives an OS
# crash as well as a killed process.
DURABLE_TYPES: Final = frozenset({TOOL_DISPATCH, EFFECT_RECEIPT, TIMER_SET, TIMER_CANCEL, TIMER_FIRED, TURN_END})

# turn/end outcomes
COMPLETED: Final = "completed"
ABORTED: Final = "aborted"  # the person stopped it
INTERRUPTED: Final = "interrupted"  # crash or shutdown
ERROR: Final = "error"
TURN_OUTCOMES: Final = frozenset({COMPLETED, ABORTED, INTERRUPTED, ERROR})

# tool/result statuses
ABORTED_BEFORE_DISPATCH: Final = "ABORTED_BEFORE_DISPATCH"
BLOCKED: Final = "blocked"  # would repeat a write whose outcome is unknown

# effect/receipt: `state` confirmed | failed | unknown; `phase` "dispatch" (the
# call's own outcome) or "reconciled" (looked up later). One of each per call.
CONFIRMED: Final = "confirmed"
FAILED: Final = "failed"
UNKNOWN: Final = "unknown"


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
