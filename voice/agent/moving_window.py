"""Where a conversation's context window stands, when it moves, and what
idle time does for it.

A request is the system prompt, the tool schemas (by name), the summary
the window carries, then every whole turn from the window's start. Between
moves each request is the one before it with the reply and the new words
appended, so a server that reuses a prompt prefix (voice.agent.side_requests)
evaluates only what is new. When the turns no longer fit, the window moves
by a large step: its start goes to where the newest turns fill about half
the budget, so the next move is about half a budget of conversation away.

Nothing of this waits on the model inside a turn:

- after a turn (`after_turn`, pure: no request) the window moves already
  when the next turn would likely not fit (its newest turns' largest cost);
- in idle time (`tend`) the turns that left are summarised and the new
  prefix is sent once for a one-token reply, so the server holds it
  evaluated (and once as the service starts, `warm_first`); a turn that
  starts meanwhile cancels that work (`cancel`) and goes on with what there
  is: without the new summary, older turns fall out;
- a turn whose words still overflow the window moves it itself, at once.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from voice.agent.providers.base import ModelRequest, Provider
from voice.agent.side_requests import warm
from voice.agent.summary import summarize, summarizes, uncovered
from voice.log.store import EventStore
from voice.log.window import Anchor, TokenCounter, Window, derive_window, latest_summary

RECENT_TURNS = 4  # the next turn is expected to cost as much as the largest of the newest few
IDLE_BOUND_S = 120.0  # the most idle work may take (each request also has the provider's timeout)


def warms(provider: Provider) -> bool:
    """Whether a cache-warming request makes sense: a model server (not the offline providers)."""
    return summarizes(provider)


class MovingWindow:
    """One agent's window: its anchor in the current conversation, and
    whether the server has seen the anchor's prefix (`sent`)."""

    def __init__(self) -> None:
        self._conversation: str | None = None
        self._anchor: Anchor | None = None
        self._sent: Anchor | None = None  # the prefix of the last request the server evaluated
        self._scope: anyio.CancelScope | None = None
        self._generation = 0  # a turn's start bumps it: idle work begun before never changes the window after
        # The window start a summary was last asked for: asked once per move. Cancelled (a turn came first),
        # it waits for the next move, as a retry would evict the turn's prefix from a one-slot server's
        # cache (llama.cpp) and keep it busy evaluating a prompt no one waits for (measured, issue #26).
        self._summary_asked: tuple[str, int] | None = None

    def anchor(self, store: EventStore, conversation: str) -> Anchor:
        """The anchor now; a conversation met for the first time (or after
        a restart) starts after its latest summary."""
        if conversation != self._conversation or self._anchor is None:
            self._conversation, self._sent = conversation, None
            self._anchor = Anchor(0, latest_summary(store, conversation))
        return self._anchor

    def window(self, store: EventStore, conversation: str, budget: int, count: TokenCounter,
               pending: list[dict] | None = None) -> tuple[Window, Anchor]:
        """The window a request carries now, and its anchor: the anchor's,
        or, when its turns (with `pending`, the words of a turn not yet in
        the log) no longer fit, the window moved. Nothing is kept: `sent`
        does that once the request goes out."""
        anchor = self.anchor(store, conversation)
        window = derive_window(store, conversation, budget, count=count, pending=pending, anchor=anchor)
        if window.dropped is None:
            return window, anchor
        moved = _moved(store, conversation, budget, count, anchor, pending)
        return derive_window(store, conversation, budget, count=count, pending=pending, anchor=moved), moved

    def sent(self, anchor: Anchor) -> None:
        """A turn's request with `anchor`'s prefix went to the server."""
        self._anchor = self._sent = anchor

    def after_turn(self, store: EventStore, conversation: str, budget: int, count: TokenCounter) -> bool:
        """Move the window now, in the turn's wake, when the next turn would
        likely overflow it: its request then has the new prefix, which idle
        time can warm. True when it moved."""
        anchor = self.anchor(store, conversation)
        window = derive_window(store, conversation, budget, count=count, anchor=anchor)
        expected = max(window.turn_tokens[-RECENT_TURNS:], default=0)
        if window.dropped is None and window.tokens + expected <= budget:
            return False
        moved = _moved(store, conversation, budget, count, anchor, None)
        if not window.turns or moved.start <= window.turns[0]:
            return False  # (a turn larger than half the budget: moving would keep the same turns)
        self._anchor = moved
        return True

    def cancel(self) -> None:
        """A turn (or an early start) outranks idle work: it ends now, and
        whatever it would still have changed is never applied."""
        self._generation += 1
        if self._scope is not None:
            self._scope.cancel()

    async def tend(self, store: EventStore, provider: Provider, conversation: str, turn: int, budget: int,
                   count: TokenCounter, request_for: Callable[[Window], ModelRequest], warm_cache: bool) -> None:
        """Idle time after `turn`: summarise the turns that left the window
        (a model server only) and, when the server has not seen the
        window's prefix, warm it. Bounded; cancellable (`cancel`)."""
        if not summarizes(provider):
            return
        generation = self._generation
        with anyio.CancelScope() as scope, anyio.move_on_after(IDLE_BOUND_S):
            self._scope = scope
            try:
                anchor = self.anchor(store, conversation)
                turns = uncovered(store, conversation, anchor)
                if turns is not None and self._summary_asked != (conversation, anchor.start):
                    self._summary_asked = (conversation, anchor.start)
                    summary = await summarize(store, provider, conversation, turn, turns, budget, count)
                    if not self._current(generation, conversation):
                        return
                    if summary is not None:
                        anchor = self._anchor = Anchor(anchor.start, summary)
                if not warm_cache or not warms(provider) or anchor == self._sent:
                    return
                window = derive_window(store, conversation, budget, count=count, anchor=anchor)
                if await warm(store, provider, conversation, turn, request_for(window)) and \
                        self._current(generation, conversation):
                    self._sent = anchor
            finally:
                if self._scope is scope:
                    self._scope = None


    async def warm_first(self, store: EventStore, provider: Provider, conversation: str, budget: int,
                         count: TokenCounter, request_for: Callable[[Window], ModelRequest], warm_cache: bool,
                         fresh: bool) -> None:
        """Once, as the service starts: the prefix the first request will
        begin with, warmed (`tend` does it after each turn), so the server
        does not evaluate the system prompt, the tool schemas and the history
        while the person waits for the first answer. `fresh`: that request
        opens a new conversation (the idle gap has passed): no history.
        Bounded; cancellable (`cancel`) like `tend`."""
        if not warm_cache or not warms(provider):
            return
        with anyio.CancelScope() as scope, anyio.move_on_after(IDLE_BOUND_S):
            self._scope = scope
            try:
                window = Window() if fresh else self.window(store, conversation, budget, count)[0]
                if not window.messages:  # (some chat templates refuse a prompt without a user message; the
                    # prefix the server keeps is what comes before it: the system prompt and the tool schemas)
                    window = Window(messages=[{"role": "user", "content": ""}])
                await warm(store, provider, conversation, None, request_for(window))
            finally:
                if self._scope is scope:
                    self._scope = None

    def _current(self, generation: int, conversation: str) -> bool:
        """No turn began, and the agent is in the same conversation, since idle work `generation` began."""
        return generation == self._generation and conversation == self._conversation


def _moved(store: EventStore, conversation: str, budget: int, count: TokenCounter, anchor: Anchor,
           pending: list[dict] | None) -> Anchor:
    """The anchor one large step on: the newest turns that fill half the budget."""
    half = derive_window(store, conversation, budget // 2, count=count, pending=pending, anchor=anchor)
    if half.turns:
        return Anchor(half.turns[0], anchor.summary)
    newest = store.turns(conversation, limit=1)  # the pending turn alone fills half: it starts the window
    return Anchor((newest[0] if newest else 0) + 1, anchor.summary)
