"""Output of a stopped or superseded unit that arrived late and was dropped
(`late/output`): one writer for every source, the speaker's sentences and
audio, a timer cancelled while it fired, an MCP result after its call was
cancelled."""

from __future__ import annotations

from typing import Any

from voice.log.events import Event, LateOutput
from voice.log.store import EventStore


def record_late(store: EventStore, conversation: str, kind: str, *, turn: int | None = None,
                step: int | None = None, attempt: int | None = None, **what: Any) -> Event:
    """`kind` tts-text | tts-audio | tts-failed | timer | mcp-result; `what`:
    the other fields of `LateOutput` (message_id, sentence, samples, error,
    timer_id, tool_call_id, server), given only where they apply."""
    return store.record(conversation, LateOutput(kind=kind, **what), turn=turn, step=step, attempt=attempt)
