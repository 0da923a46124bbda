"""The in-process feed of appended events: who follows the log (`voice ctl
events`) is handed each row as it is committed, instead of polling SQLite.

Appends are synchronous and must never wait for a reader, so each
subscriber has a bounded buffer filled with `send_nowait`. A subscriber
that lets it fill up is dropped, not waited for: its iteration ends after
the events it holds, with `lagged` set, and it catches up from the log
(`follow` does that by itself). Publish from the event loop's thread (every
writer does): memory streams are not thread-safe.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from voice.log.events import Event

DEFAULT_BUFFER = 1024


class Subscription:
    """Events committed from its start on, in order. Iterate it (`async for
    event in subscription`) or `await subscription.receive()`; either ends
    (`EndOfStream`) when it was dropped for falling behind (`lagged` is then
    True) or the log was closed."""

    def __init__(self, feed: EventFeed, max_buffer: int):
        self._feed = feed
        self._send: MemoryObjectSendStream[Event]
        self._receive: MemoryObjectReceiveStream[Event]
        self._send, self._receive = anyio.create_memory_object_stream[Event](max_buffer)
        self.lagged = False

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._feed._drop(self)
        self._send.close()
        self._receive.close()

    async def receive(self) -> Event:
        return await self._receive.receive()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._receive.__aiter__()

    def _offer(self, event: Event) -> bool:
        """Hand over one event without waiting; False when this subscriber
        is gone or has fallen behind (and is now closed for sending)."""
        try:
            self._send.send_nowait(event)
        except anyio.WouldBlock:
            self.lagged = True
            self._send.close()  # what it holds can still be read; then it ends
            return False
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False  # its reader went away
        return True


class EventFeed:
    """The subscribers of one store."""

    def __init__(self) -> None:
        self._subscribers: list[Subscription] = []

    def subscribe(self, max_buffer: int = DEFAULT_BUFFER) -> Subscription:
        subscription = Subscription(self, max_buffer)
        self._subscribers.append(subscription)
        return subscription

    def publish(self, event: Event) -> None:
        for subscription in list(self._subscribers):
            if not subscription._offer(event):
                self._drop(subscription)

    def close(self) -> None:
        """The log is closing: every subscription ends after what it holds."""
        for subscription in self._subscribers:
            subscription._send.close()
        self._subscribers.clear()

    def _drop(self, subscription: Subscription) -> None:
        if subscription in self._subscribers:
            self._subscribers.remove(subscription)


class FollowedLog(Protocol):
    """What `follow` reads of a log (an `EventStore`): its rows after a seq,
    and the feed of the ones committed from now on. (A protocol, so the feed
    needs no import of the store, which imports it.)"""

    def events(self, *, after_seq: int = 0) -> Iterable[Event]: ...

    def subscribe(self, max_buffer: int = DEFAULT_BUFFER) -> Subscription: ...


async def follow(store: FollowedLog, after_seq: int = 0, max_buffer: int = DEFAULT_BUFFER) -> AsyncIterator[Event]:
    """Every event after `after_seq` in order, then each one as it is
    committed, until the store is closed: the backlog is read from the log
    while the feed already collects, so nothing falls between the two and
    nothing comes twice. A follower that falls behind the feed reads the
    log again from where it was. Close it when done (`contextlib.aclosing`)."""
    while True:
        with store.subscribe(max_buffer) as live:
            for event in store.events(after_seq=after_seq):
                yield event
                after_seq = event.seq
            async for event in live:
                if event.seq > after_seq:  # (rows the backlog already gave)
                    yield event
                    after_seq = event.seq
            if not live.lagged:
                return
