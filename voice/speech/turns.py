"""The turn runner: requests, spoken or typed, answered one at a time.

Utterances that ask for something, typed turns (`voice ctl say`) and the
person's stops all go through one queue, so the transcript is written in
the order things happened: `you: …` as a request's turn starts (after the
`assistant: … [stopped]` line of the reply it cut), `assistant: …` as a
turn ends however it ends. A stop is written down (`user/stop`) in its
place in that order and opens no turn.

While nothing runs, `start_early(words)` starts the model on words the
person may still add to (voice.agent.preempt): the turn that is then
committed with exactly those words reads that request; any other outcome
drops it (`assistant/attempt`, reason superseded). Nothing of it leaves the
process before the commit.

`close()` ends the queue: nothing queued after it starts a turn, and a
request submitted after it is refused (`anyio.ClosedResourceError`, or
`anyio.BrokenResourceError` once the runner has returned). The
session closes it at shutdown, before it cancels the running turn.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from voice.agent.loop import AgentLoop, TurnResult
from voice.agent.preempt import EarlyStart
from voice.audio.playback import PlaybackBuffer
from voice.log import events as ev
from voice.log.conversations import NewConversation, end_and_open, last_activity
from voice.log.events import UserStop
from voice.log.projections import turn_reply
from voice.log.store import EventStore
from voice.speech.judge import stop_intent
from voice.speech.settings import ConversationRules


@dataclass
class Request:
    """An utterance (or typed text) waiting for its turn, or (`stop` set) a
    stop the person said, waiting only to be written down in order."""

    text: str
    source: str
    start: int  # mic sample positions of the utterance (typed: where the mic stood)
    end: int
    stt_s: float
    # Why it is no request: "stop" (a stop intent); "backchannel" or "sound" (no
    # words, or too unsure to be words) when it had cut the reply by its length.
    stop: str | None = None
    stopped_turn: int | None = None
    done: anyio.Event | None = None  # set once its turn has ended (typed turns wait on it)
    result: TurnResult | None = None
    # A new conversation, asked for: "asked" (the person said so), "new" (`voice ctl new`).
    new: str | None = None
    switched: NewConversation | None = None  # set once such a request was handled
    asked_again: ev.ApprovalRequested | None = None  # no words: a question a crash left unanswered, asked again


@dataclass
class TurnInfo:
    """What the session knows of one turn beyond the log: where its
    utterance lay on the mic clock, and when a barge-in stopped it."""

    turn: int
    user_text: str
    utterance_start: int  # mic samples
    utterance_end: int
    stt_s: float
    text_ready_at: float  # loop time when the transcript reached the runtime
    barge_in_onset: int | None = None  # VAD onset of the speech that stopped it
    clear_position: int | None = None  # device position where the output paused or cleared after that onset


class TurnRunner:
    """`turns` holds the newest `keep` turns' `TurnInfo` (None: every turn, for
    a finite replay's summary): a service runs for weeks in flat memory."""

    def __init__(self, agent: AgentLoop, store: EventStore, buffer: PlaybackBuffer, *,
                 transcript: Callable[[str], None], aside: Callable[[str], None] | None = None, queue: int = 16,
                 keep: int | None = 64, conversations: ConversationRules | None = None,
                 notice: Callable[[str], Awaitable[None]] | None = None,
                 before_turn: Callable[[], None] = lambda: None):
        self.agent = agent
        self.store = store
        self.buffer = buffer
        self.transcript = transcript
        self.aside = aside
        self.before_turn = before_turn  # the session notes the device's clock (audio/clock) there
        self.turns: deque[TurnInfo] = deque(maxlen=keep)
        self.rules = conversations or ConversationRules()
        self.notice = notice  # says the new conversation's acknowledgement
        self.waiting = 0  # requests submitted whose turn has not ended
        self._send, self._receive = anyio.create_memory_object_stream[Request](queue)
        self._running: TurnInfo | None = None
        self._closed = False
        self._early: EarlyStart | None = None
        self._early_tasks: anyio.abc.TaskGroup | None = None
        self.early_starts = self.early_used = 0  # the benchmark counts them

    @property
    def conversation(self) -> str:
        return self.agent.conversation

    async def submit(self, request: Request) -> None:
        """Queue a request (waits while the queue is full). Raises
        anyio.ClosedResourceError once the runner is closed."""
        self.waiting += 1
        self.agent.cancel_summary()  # a summary after the last turn never holds up a request
        try:
            await self._send.send(request)
        except BaseException:
            self.waiting -= 1
            raise

    async def say(self, text: str, source: str, position: int) -> TurnResult | NewConversation:
        """A typed turn, answered like a spoken one; returns its result (or,
        for text that only asks for a new conversation, what that did)."""
        request = Request(text, source, position, position, 0.0, done=anyio.Event())
        await self.submit(request)
        await request.done.wait()
        if request.switched is not None:
            return request.switched
        if request.result is None:
            raise anyio.ClosedResourceError("the assistant stopped before this turn ran")
        return request.result

    def mark_cut(self, onset: int) -> None:
        """The running turn was cut by speech that began at `onset`."""
        if self._running is not None:
            self._running.barge_in_onset = onset

    def close(self) -> None:
        self._closed = True
        self._send.close()

    async def run(self) -> None:
        """Answer requests until closed (or cancelled: a turn then closes
        `interrupted`, with its heard prefix recorded, and is printed).
        However it ends, what is still queued never starts, and whoever
        waits on it is told so (`say` raises ClosedResourceError).
        Meanwhile the idle gap ends the conversation when it passes."""
        async with anyio.create_task_group() as tg:
            if self.rules.idle_gap_s is not None:
                tg.start_soon(self._end_when_idle, self.rules.idle_gap_s)
            await self._answer()
            tg.cancel_scope.cancel()

    async def _end_when_idle(self, gap_s: float) -> None:
        """End the conversation as soon as the idle gap passes, not only at
        the next request: `voice ctl status`, `history --list` and the log
        then say it ended. A request queued or running ends it in its place."""
        while True:
            idle = self._idle()  # one read of the log a wake-up
            if idle is not None and idle >= gap_s and not self.waiting and self._running is None and not self._closed:
                self._switch("idle", idle_s=idle)
                idle = None
            await anyio.sleep(max(0.1, gap_s - (idle or 0.0)))

    async def _answer(self) -> None:
        async with self._receive, anyio.create_task_group() as early_tasks:
            self._early_tasks = early_tasks
            try:
                async for request in self._receive:
                    try:
                        if not self._closed:  # once closed, what is still queued never starts
                            await self._handle(request)
                    finally:
                        self._done(request)
                    if request.result is not None and not self.waiting and not self._closed:
                        await self.agent.summarize_after(request.result.turn)  # a request that comes cancels it
            finally:
                self._early_tasks = None
                self.drop_early()
                self.close()
                while True:
                    try:
                        self._done(self._receive.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break

    def start_early(self, text: str) -> None:
        """Start the model on `text` if nothing runs or waits; an early start
        on other words is dropped first."""
        if self._early is not None and self._early.text == text:
            return
        self.drop_early()
        if self._early_tasks is None or self._closed or self.waiting or self.agent.busy:
            return
        if self.rules.new_phrases and stop_intent(text, self.rules.new_phrases):
            return  # "start over" asks the model nothing
        # After the idle gap the turn will open a new conversation: the request it sends has no history.
        self._early = self.agent.start_early(text, fresh=self._idle_s() is not None)
        self.early_starts += 1
        self._early_tasks.start_soon(self._early.run)

    def drop_early(self) -> None:
        """The words it answered are no longer the person's (they went on)."""
        early, self._early = self._early, None
        if early is not None and not early.taken:
            self.agent.drop_early(early)

    def _take_early(self, request: Request) -> EarlyStart | None:
        early = self._early
        if early is not None and request.stop is None and request.text == early.text:
            self._early = None
            self.early_used += 1
            return early
        self.drop_early()
        return None

    def _done(self, request: Request) -> None:
        self.waiting -= 1
        if request.done is not None:
            request.done.set()

    async def new_conversation(self, position: int) -> str:
        """`voice ctl new`: end the conversation in its place in the queue
        (after the running turn); returns the conversation that follows."""
        request = Request("", "ctl", position, position, 0.0, done=anyio.Event(), new="new")
        await self.submit(request)
        await request.done.wait()
        return self.conversation

    async def _handle(self, request: Request) -> None:
        early = self._take_early(request)  # dropped unless this turn asks exactly what it answers
        if request.stop != "sound" and request.new != "new" and request.asked_again is None:
            self.transcript(f"you: {request.text}")
        if request.stop is not None:
            self._record_stop(request)
            if self.aside is not None:
                what = {"stop": "a stop", "backchannel": "a backchannel"}.get(request.stop, "a sound")
                self.aside(f"({what}: not a request, so nothing more is said)")
            return
        self._end_if_idle()
        if request.new is None and self.rules.new_phrases and stop_intent(request.text, self.rules.new_phrases):
            request.new = "asked"
        if request.new is not None:
            if early is not None:  # "start over" asks for no answer
                self.agent.drop_early(early)
            before = self.conversation
            self._switch(request.new, words=request.text if request.new == "asked" else None)
            request.switched = NewConversation(before, self.conversation)
            if self.rules.new_reply and self.notice is not None and request.new == "asked":
                await self.notice(self.rules.new_reply)
            return
        info = TurnInfo(-1, request.text, request.start, request.end, request.stt_s, anyio.current_time())
        self.turns.append(info)
        self._running = info
        before = self.store.last_seq()
        audio = None
        if request.source == "voice":
            audio = {"start": request.start, "end": request.end, "stt_ms": round(request.stt_s * 1000, 1)}
        self.before_turn()
        try:
            request.result = await self.agent.run_turn(request.text, source=request.source, audio=audio, early=early,
                                                       asked_again=request.asked_again)
        except anyio.get_cancelled_exc_class():  # shutdown: the turn closed `interrupted`
            started = self.store.events(self.conversation, types={ev.TURN_START}, after_seq=before)
            if started:
                self._print_reply(started[0].turn)
            raise
        finally:
            self._running = None
            if early is not None and not early.taken:  # the turn ended before its first request
                self.agent.drop_early(early)
        info.turn = request.result.turn
        if info.barge_in_onset is not None:  # the acknowledgement: output paused (or cleared) after the onset
            marks = sorted(self.buffer.pauses + self.buffer.clears)
            info.clear_position = next((c for c in marks if c >= info.barge_in_onset), None)
        self._print_reply(info.turn)

    def _end_if_idle(self) -> None:
        """The conversation ends once `idle_gap_s` passed without activity
        (on the log's clock: wall time, or a replay's virtual time)."""
        idle = self._idle_s()
        if idle is not None:
            self._switch("idle", idle_s=idle)

    def _idle_s(self) -> float | None:
        """How long the conversation has been idle, once that is past the gap."""
        gap_s = self.rules.idle_gap_s
        idle = self._idle() if gap_s is not None else None
        return idle if idle is not None and idle >= gap_s else None

    def _idle(self) -> float | None:
        """Seconds since the conversation's latest activity (None: none yet), on
        the log's clock (wall time, or a replay's virtual time)."""
        last = last_activity(self.store, self.conversation)
        return None if last is None else max(0.0, time.time() - last)

    def _switch(self, reason: str, *, idle_s: float | None = None, words: str | None = None) -> None:
        """End the conversation (unless nothing happened in it yet) and
        answer from now on in a new one."""
        before = self.conversation
        self.agent.conversation = end_and_open(self.store, before, reason, idle_s=idle_s, words=words)
        if self.conversation != before and self.aside is not None:
            self.aside(f"(conversation ended: {reason}; new conversation {self.conversation})")

    def _print_reply(self, turn: int) -> None:
        """`assistant: …` with `[stopped]` when the reply ended early, however it ended."""
        reply = turn_reply(self.store, self.conversation, turn)
        stopped = reply.interrupted or reply.outcome in (ev.ABORTED, ev.INTERRUPTED)
        if reply.delivered_text or stopped:
            self.transcript(" ".join(p for p in ("assistant:", reply.delivered_text, "[stopped]" if stopped else "")
                                     if p))

    def _record_stop(self, request: Request) -> None:
        """The person's stop: a record of what they said, in no turn of its
        own (it is not a request), filed under the turn it stopped."""
        self.store.record(self.conversation, UserStop(content=request.text, source=request.source,
                                                      intent=request.stop, stopped_turn=request.stopped_turn),
                          turn=request.stopped_turn)
