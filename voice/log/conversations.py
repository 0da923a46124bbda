"""Conversations that end: which one a request belongs to, and the list.

A conversation ends with a `conversation/end` event (an idle gap, the
person asked, `voice ctl new`), never by deleting anything: an ended
conversation stays readable (`voice history --list`, `voice history
--conversation ID`) and forkable. The next request opens a new one.

Activity, for the idle gap, is what the person or the assistant said or
did in a turn (its start and end) and a stop the person said; a timer that
rings into an old conversation does not keep it open.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from voice.log import events as ev
from voice.log.store import EventStore, new_conversation_id

ACTIVITY = frozenset({ev.TURN_START, ev.TURN_END, ev.USER_STOP, ev.CONVERSATION_FORK})


def ended(store: EventStore, conversation: str) -> ev.ConversationEnd | None:
    """The conversation's end, if it has ended."""
    event = store.last_of(conversation, {ev.CONVERSATION_END})
    return event.body if event is not None else None


def last_activity(store: EventStore, conversation: str) -> float | None:
    """Wall-clock time of the conversation's latest activity (None: none yet)."""
    event = store.last_of(conversation, ACTIVITY)
    return event.at_wall if event is not None else None


def idle_for(store: EventStore, conversation: str, now: float | None = None) -> float:
    """Seconds since the conversation's latest activity (0 when it has none)."""
    last = last_activity(store, conversation)
    return 0.0 if last is None else max(0.0, (time.time() if now is None else now) - last)


def end_conversation(store: EventStore, conversation: str, reason: str, *, idle_s: float | None = None,
                     words: str | None = None) -> ev.ConversationEnd | None:
    """Record the end (once: an ended conversation is not ended again).
    Returns the end recorded, or None when it had already ended."""
    if ended(store, conversation) is not None:
        return None
    fields = {"idle_s": round(idle_s, 1)} if idle_s is not None else {}
    if words is not None:
        fields["words"] = words
    body = ev.ConversationEnd(reason=reason, **fields)
    store.record(conversation, body)
    return body


@dataclass(frozen=True)
class NewConversation:
    """What a request that asked for a new conversation did: no
    turn; `before` ended (unless nothing was said in it: then `after` is it)."""

    before: str
    after: str


def end_and_open(store: EventStore, conversation: str, reason: str, *, idle_s: float | None = None,
                 words: str | None = None) -> str:
    """End `conversation` and return a new one's id; a conversation in which
    nothing happened yet is not ended: it is returned as it is."""
    if last_activity(store, conversation) is None:
        return conversation
    end_conversation(store, conversation, reason, idle_s=idle_s, words=words)
    return new_conversation_id()


def resume_or_new(store: EventStore, idle_gap_s: float, now: float | None = None) -> str:
    """The conversation a starting service continues: the latest one if it
    has not ended and was active within `idle_gap_s`; else a new one (the
    latest is then ended `idle`, so the log says why)."""
    latest = store.latest_conversation()
    if latest is None or ended(store, latest) is not None:
        return new_conversation_id()
    gap = idle_for(store, latest, now)
    if last_activity(store, latest) is not None and gap >= idle_gap_s:
        end_conversation(store, latest, "idle", idle_s=gap)
        return new_conversation_id()
    return latest


@dataclass(frozen=True)
class ConversationInfo:
    conversation: str
    turns: int
    first_wall: float
    last_wall: float
    ended: str | None  # the end's reason, None while it is open
    first_words: str  # the person's first request


def list_conversations(store: EventStore) -> list[ConversationInfo]:
    """Every conversation in the log, oldest first."""
    out = []
    for conversation, _count, first, last in store.conversation_spans():
        end = ended(store, conversation)
        first_turn = store.first_turn(conversation)
        words = ""
        if first_turn is not None:
            words = next((e.body.content for e in store.events(conversation, turn=first_turn,
                                                               types={ev.USER_MESSAGE})), "")
        turns = len(store.turns(conversation, limit=1_000_000))
        out.append(ConversationInfo(conversation, turns, first, last, end.reason if end else None, words))
    return out
