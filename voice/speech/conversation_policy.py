"""Conversation policy, for every surface (`voice chat`, the voice session's
turn runner): which conversation a request is answered in.

- The idle gap: a request after `idle_gap_s` without activity (on the log's
  clock: wall time, or a replay's virtual time) opens a new conversation,
  and so does the idle watcher as soon as the gap passes (`voice ctl
  status`, `history --list` then say it ended).
- Asked for: words that are only a new-conversation phrase ("start over"),
  or `voice ctl new`, end the conversation; the words ask the model nothing.
- Switching: the ended conversation gets its `conversation/end`
  (voice.log.conversations), unless nothing happened in it yet (it goes on).

This module is the only one that reassigns `agent.conversation`. Where a
starting service resumes is `voice.log.conversations.resume_or_new`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from voice.agent.loop import AgentLoop
from voice.log.conversations import NewConversation, end_and_open, last_activity
from voice.log.store import EventStore
from voice.speech.judge import stop_intent
from voice.settings import ConversationSettings


class ConversationPolicy:
    def __init__(self, agent: AgentLoop, store: EventStore, rules: ConversationSettings | None = None, *,
                 aside: Callable[[str], None] | None = None):
        self.agent = agent
        self.store = store
        self.rules = rules or ConversationSettings()
        self.aside = aside  # -v: says when a conversation ended
        self._wake = anyio.Event()  # set when what the idle watcher waits for may have changed

    @property
    def conversation(self) -> str:
        return self.agent.conversation

    def asks_new(self, text: str) -> bool:
        """The words are only a new-conversation phrase ("start over")."""
        return bool(self.rules.new_phrases) and stop_intent(text, self.rules.new_phrases)

    def idle_s(self) -> float | None:
        """How long the conversation has been idle, once that is past the gap (None: not past it)."""
        gap_s = self.rules.idle_gap_s
        idle = self._idle() if gap_s is not None else None
        return idle if idle is not None and idle >= gap_s else None

    def end_if_idle(self) -> NewConversation | None:
        """Before a request: a new conversation once the idle gap has passed."""
        idle = self.idle_s()
        return self.switch("idle", idle_s=idle) if idle is not None else None

    def switch(self, reason: str, *, idle_s: float | None = None, words: str | None = None) -> NewConversation:
        """End the conversation (unless nothing happened in it yet) and
        answer from now on in a new one."""
        before = self.conversation
        self.agent.cancel_idle()  # a summary or warming of the conversation that ends is of no more use
        self.agent.conversation = end_and_open(self.store, before, reason, idle_s=idle_s, words=words)
        if self.conversation != before and self.aside is not None:
            self.aside(f"(conversation ended: {reason}; new conversation {self.conversation})")
        self.changed()
        return NewConversation(before, self.conversation)

    def changed(self) -> None:
        """Something the idle watcher waits on happened (a request ended, the conversation changed)."""
        self._wake.set()

    async def end_when_idle(self, quiet: Callable[[], bool]) -> None:
        """End the conversation as soon as the idle gap passes, not only at
        the next request. `quiet()`: no request is queued or running (one
        that is ends it in its place). Wakes at the gap's deadline or at
        `changed()`, reading the log once a wake-up; never returns."""
        gap_s = self.rules.idle_gap_s
        if gap_s is None:
            await anyio.sleep_forever()
        while True:
            self._wake = anyio.Event()
            delay = gap_s  # nothing happened yet, or a request runs: re-read at the latest after one gap
            if quiet():
                idle = self._idle()
                if idle is not None and idle >= gap_s:
                    self.switch("idle", idle_s=idle)
                elif idle is not None:
                    delay = max(0.1, gap_s - idle)
            with anyio.move_on_after(delay):
                await self._wake.wait()

    def _idle(self) -> float | None:
        """Seconds since the conversation's latest activity (None: none yet)."""
        last = last_activity(self.store, self.conversation)
        return None if last is None else max(0.0, time.time() - last)
