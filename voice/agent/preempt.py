"""Starting the model before the turn is committed, without side effects.

At a pause the person's words are often known before the turn ends
(voice.speech.turn_end). An `EarlyStart` sends the request the turn would
send (the history plus those words) at once, and only *buffers* what the
model streams: nothing reaches the surface (so no sample can play), the
tool runner (so no tool is dispatched, no timer set) or the log. Effects
are impossible by construction, not by a check.

- The turn is committed with the same words and the same request: the turn
  reads the buffer from its start and then the live stream
  (`AgentLoop.run_turn(..., early=)`); what was streamed counts from there,
  with tool calls dispatched by the turn like any other, after the commit.
- The person goes on, the words change, or the turn's request differs: the
  stream is cancelled and kept for the record as an `assistant/attempt`
  with reason `superseded`, in no turn: never heard, never in history.

An onlooker may follow the stream as it is buffered (`watch()`: the voice
synthesizes the first sentence before the commit, voice.speech.early_speech);
it neither takes the request nor stops it, and whatever it makes stays in
the process until the commit.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

import anyio

from voice.agent.providers.base import Delta, ModelRequest, Provider, ProviderError, TextDelta


@dataclass(eq=False)
class EarlyStart:
    text: str  # the speculative words the request answers
    request: ModelRequest
    provider: Provider
    number: int  # in this session: the attempt's id is early_<number>
    deltas: list[Delta] = field(default_factory=list)
    error: ProviderError | None = None
    finished: bool = False
    taken: bool = False  # a committed turn reads it
    # When (time.monotonic, read at call time: a replay's virtual clock) its words were known, its request
    # went out and its first text came: the turn that reads it logs them (`assistant/message` early).
    words_at: float = field(default_factory=lambda: time.monotonic())
    sent_at: float | None = None
    first_text_at: float | None = None
    _scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    _changed: anyio.Event = field(default_factory=anyio.Event)

    @property
    def message_id(self) -> str:
        return f"early_{self.number}"

    async def run(self) -> None:
        """Buffer the stream (in the task group of whoever started it)."""
        with self._scope:
            self.sent_at = time.monotonic()
            stream = self.provider.stream(self.request)
            try:
                async for delta in stream:
                    if self.first_text_at is None and isinstance(delta, TextDelta):
                        self.first_text_at = time.monotonic()
                    self.deltas.append(delta)
                    self._wake()
            except ProviderError as exc:  # the committed turn sees it as its own request's error
                self.error = exc
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                    await stream.aclose()
                self.finished = True
                self._wake()

    def cancel(self) -> None:
        self._scope.cancel()

    def _wake(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def stream(self) -> AsyncIterator[Delta]:
        """The committed turn's view: every delta so far, then the rest as
        they come. However the reader stops (done, or its turn cancelled),
        the request stops with it."""
        self.taken = True
        try:
            async with aclosing(self.watch()) as deltas:
                async for delta in deltas:
                    yield delta
            if self.error is not None:
                raise self.error
        finally:
            self.cancel()

    async def watch(self) -> AsyncIterator[Delta]:
        """An onlooker's view: every delta so far, then the rest as they come,
        until the stream ends (finished, failed or dropped). It neither takes
        the request nor stops it."""
        sent = 0
        while True:
            while sent < len(self.deltas):
                yield self.deltas[sent]
                sent += 1
            if self.finished:
                return
            await self._changed.wait()  # no await since the check: no delta can slip between
