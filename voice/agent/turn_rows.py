"""The one writer of the rows a model request leaves (docs/EVENTS.md): its step's start and end, the stream's frames, an
attempt kept for the record, a request's error, and the result of a call
that never finished. The loop writes them as a turn runs, the summary for
its own request and a cache-warming one (voice.agent.side_requests), start-up recovery for a turn a crash left open: all three
through these functions, so each of these types is built in this module only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from voice.log import events as ev
from voice.log.events import UNSET
from voice.log.store import EventStore


@dataclass(frozen=True)
class Place:
    """Where a row is filed: a conversation and, in it, a turn, step and attempt."""

    conversation: str
    turn: int | None = None
    step: int | None = None
    attempt: int | None = None


def record(store: EventStore, place: Place, body: ev.Body) -> ev.Event:
    return store.record(place.conversation, body, turn=place.turn, step=place.step, attempt=place.attempt)


def step_start(store: EventStore, place: Place, route: ev.Route) -> None:
    record(store, place, ev.StepStart(route=route))


def step_end(store: EventStore, place: Place, outcome: str) -> None:
    record(store, place, ev.StepEnd(outcome=outcome))


def stream_start(store: EventStore, place: Place, route: ev.Route) -> None:
    record(store, place, ev.AssistantStream.start(route))


def stream_end(store: EventStore, place: Place, finish_reason: str | None) -> None:
    record(store, place, ev.AssistantStream.end(finish_reason))


def stream_failed(store: EventStore, place: Place, error: str) -> None:
    record(store, place, ev.AssistantStream.end_failed(error))


def stream_stopped(store: EventStore, place: Place, reason: str = UNSET) -> None:
    """Stopped (or, `reason` "crashed", closed by recovery) mid-stream."""
    record(store, place, ev.AssistantStream.end_stopped(reason))


def attempt(store: EventStore, place: Place, reason: str, *, message_id: str, content: list[ev.ContentBlock],
            route: ev.Route | None = UNSET, finish_reason: str | None = UNSET, stream: list[Any] | None = UNSET,
            receipts: list[str] | None = UNSET, early: dict[str, float | None] | None = UNSET) -> None:
    """A stream kept for the record that adds nothing to history (`reason`:
    empty | error | aborted | withheld | crashed | superseded | warm)."""
    record(store, place, ev.AssistantAttempt(message_id=message_id, content=content, route=route,
                                             finish_reason=finish_reason, stream=stream, reason=reason,
                                             receipts=receipts, early=early))


def request_failed(store: EventStore, place: Place, message: str, status: int | None, retryable: bool) -> None:
    """A provider request failed (after its attempt is recorded)."""
    record(store, place, ev.RequestError(message=message, status=status, retryable=retryable))
