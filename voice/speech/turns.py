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
drops it (`assistant/attempt`, reason superseded). Its first sentence is
synthesized meanwhile (voice.speech.early_speech) and played only by that
turn. Nothing of it leaves the process before the commit.

`close()` ends the queue: nothing queued after it starts a turn, and a
request submitted after it is refused (`anyio.ClosedResourceError`, or
`anyio.BrokenResourceError` once the runner has returned). The
session closes it at shutdown, before it cancels the running turn.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from voice.agent.loop import AgentLoop
from voice.agent.turn_state import TurnResult
from voice.agent.preempt import EarlyStart
from voice.audio.playback import PlaybackBuffer
from voice.log import events as ev
from voice.log.conversations import NewConversation
from voice.log.projections import turn_reply
from voice.log.store import EventStore
from voice.speech.conversation_policy import ConversationPolicy
from voice.speech.early_speech import EarlySpeech
from voice.speech.speech_log import SpeechLog


@dataclass
class Request:
    """Something waiting for its place in the queue, with where it lay on the
    mic clock (typed: where the mic stood). One of the variants below."""

    text: str
    source: str
    start: int  # mic sample positions of the utterance
    end: int
    stt_s: float
    done: anyio.Event | None = field(default=None, kw_only=True)  # set once handled (typed turns wait on it)
    # What handling it did: the turn's result, or (words that only ask for one) the new conversation.
    outcome: TurnResult | NewConversation | None = field(default=None, kw_only=True)


@dataclass
class Ask(Request):
    """Words that ask for something: a turn (or, when they only ask for a
    new conversation, that)."""


@dataclass
class Stop(Request):
    """The person's stop, waiting only to be written down in order."""

    # "stop" (a stop intent); "backchannel" or "sound" (no words, or too unsure
    # to be words) when it had cut the reply by its length.
    intent: str = field(kw_only=True)
    stopped_turn: int | None = field(default=None, kw_only=True)


@dataclass
class StartOver(Request):
    """`voice ctl new`: the conversation ends in its place in the queue."""


@dataclass
class AskAgain(Request):
    """No words: a question a crash left unanswered, asked again in a turn of its own."""

    asked: ev.ApprovalRequested = field(kw_only=True)


@dataclass
class TurnInfo:
    """What the session knows of one turn beyond the log: where its
    utterance lay on the mic clock, and when a barge-in stopped it."""

    turn: int
    conversation: str  # the one the turn ran in (a `new` between turns starts another)
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
                 keep: int | None = 64, conversations: ConversationPolicy | None = None,
                 notice: Callable[[str], Awaitable[None]] | None = None, log: SpeechLog | None = None,
                 early_speech: EarlySpeech | None = None):
        self.agent = agent
        self.store = store
        self.buffer = buffer
        self.transcript = transcript
        self.aside = aside
        self.log = log  # audio/clock before each turn, user/stop in its place (voice.speech.speech_log)
        self.turns: deque[TurnInfo] = deque(maxlen=keep)
        self.conversations = conversations or ConversationPolicy(agent, store)  # voice.speech.conversation_policy
        self.rules = self.conversations.rules
        self.notice = notice  # says the new conversation's acknowledgement
        self.waiting = 0  # requests submitted whose turn has not ended
        self._send, self._receive = anyio.create_memory_object_stream[Request](queue)
        self._running: TurnInfo | None = None
        self._closed = False
        self._early: EarlyStart | None = None
        self._early_tasks: anyio.abc.TaskGroup | None = None
        self.early_speech = early_speech  # its first sentence synthesized before the commit (voice.speech.early_speech)
        self.early_starts = self.early_used = 0  # the benchmark counts them

    @property
    def conversation(self) -> str:
        return self.agent.conversation

    async def submit(self, request: Request) -> None:
        """Queue a request (waits while the queue is full). Raises
        anyio.ClosedResourceError once the runner is closed."""
        self.waiting += 1
        self.agent.cancel_idle()  # a summary or cache warming after the last turn never holds up a request
        try:
            await self._send.send(request)
        except BaseException:
            self.waiting -= 1
            raise

    async def say(self, text: str, source: str, position: int) -> TurnResult | NewConversation:
        """A typed turn, answered like a spoken one; returns its result (or,
        for text that only asks for a new conversation, what that did)."""
        request = Ask(text, source, position, position, 0.0, done=anyio.Event())
        await self.submit(request)
        await request.done.wait()
        if request.outcome is None:
            raise anyio.ClosedResourceError("the assistant stopped before this turn ran")
        return request.outcome

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
                # (a request queued or running ends it in its place)
                tg.start_soon(self.conversations.end_when_idle, self._quiet)
            await self._answer()
            tg.cancel_scope.cancel()

    def _quiet(self) -> bool:
        return not self.waiting and self._running is None and not self._closed

    async def _answer(self) -> None:
        async with self._receive, anyio.create_task_group() as early_tasks:
            self._early_tasks = early_tasks
            try:
                if not self.waiting and not self._closed:  # (a request already queued cancels nothing: none runs yet)
                    await self.agent.warm_at_start(fresh=self.conversations.idle_s() is not None)
                async for request in self._receive:
                    try:
                        if not self._closed:  # once closed, what is still queued never starts
                            await self._handle(request)
                    finally:
                        self._done(request)
                    if isinstance(request.outcome, TurnResult) and not self.waiting and not self._closed:
                        await self.agent.use_idle_time(request.outcome.turn)  # a request that comes cancels it
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
        if self.conversations.asks_new(text):
            return  # "start over" asks the model nothing
        # After the idle gap the turn will open a new conversation: the request it sends has no history.
        self._early = self.agent.start_early(text, fresh=self.conversations.idle_s() is not None)
        self.early_starts += 1
        self._early_tasks.start_soon(self._early.run)
        if self.early_speech is not None:
            self._early_tasks.start_soon(self.early_speech.run, self._early)

    def drop_early(self) -> None:
        """The words it answered are no longer the person's (they went on)."""
        early, self._early = self._early, None
        if early is not None and not early.taken:
            self._drop_speech(early)
            self.agent.drop_early(early)

    def _drop_speech(self, early: EarlyStart) -> None:
        """What was synthesized of `early` is never played (it was dropped, or its turn is over)."""
        if self.early_speech is not None:
            self.early_speech.drop(early)

    def _take_early(self, request: Request) -> EarlyStart | None:
        early = self._early
        if early is not None and isinstance(request, Ask) and request.text == early.text:
            self._early = None
            self.early_used += 1
            return early
        self.drop_early()
        return None

    def _done(self, request: Request) -> None:
        self.waiting -= 1
        if request.done is not None:
            request.done.set()
        self.conversations.changed()  # the idle watcher may now end the conversation

    async def new_conversation(self, position: int) -> str:
        """`voice ctl new`: end the conversation in its place in the queue
        (after the running turn); returns the conversation that follows."""
        request = StartOver("", "ctl", position, position, 0.0, done=anyio.Event())
        await self.submit(request)
        await request.done.wait()
        return self.conversation

    async def _handle(self, request: Request) -> None:
        early = self._take_early(request)  # dropped unless this turn asks exactly what it answers
        sound = isinstance(request, Stop) and request.intent == "sound"
        if isinstance(request, (Ask, Stop)) and not sound:
            self.transcript(f"you: {request.text}")
        if isinstance(request, Stop):
            if self.log is not None:
                self.log.user_stop(request.text, request.source, request.intent, request.stopped_turn)
            if self.aside is not None:
                what = {"stop": "a stop", "backchannel": "a backchannel"}.get(request.intent, "a sound")
                self.aside(f"({what}: not a request, so nothing more is said)")
            return
        self.conversations.end_if_idle()
        asked = isinstance(request, Ask) and self.conversations.asks_new(request.text)
        if asked or isinstance(request, StartOver):
            if early is not None:  # "start over" asks for no answer
                self._drop_speech(early)
                self.agent.drop_early(early)
            request.outcome = self.conversations.switch("asked" if asked else "new",
                                                        words=request.text if asked else None)
            if asked and self.rules.new_reply and self.notice is not None:
                await self.notice(self.rules.new_reply)
            return
        info = TurnInfo(-1, self.conversation, request.text, request.start, request.end, request.stt_s, anyio.current_time())
        self.turns.append(info)
        self._running = info
        before = self.store.last_seq()
        audio = None
        if request.source == "voice":
            audio = {"start": request.start, "end": request.end, "stt_ms": round(request.stt_s * 1000, 1)}
        if self.log is not None:
            self.log.clock()  # the device's clock, paired with the log's, before the turn
        try:
            request.outcome = await self.agent.run_turn(
                request.text, source=request.source, audio=audio, early=early,
                asked_again=request.asked if isinstance(request, AskAgain) else None)
        except anyio.get_cancelled_exc_class():  # shutdown: the turn closed `interrupted`
            started = self.store.events(self.conversation, types={ev.TURN_START}, after_seq=before)
            if started:
                self._print_reply(started[0].turn)
            raise
        finally:
            self._running = None
            if early is not None:
                self._drop_speech(early)  # its first sentence was said by now, or never will be
                if not early.taken:  # the turn ended before its first request
                    self.agent.drop_early(early)
        info.turn = request.outcome.turn
        if info.barge_in_onset is not None:  # the acknowledgement: output paused (or cleared) after the onset
            marks = sorted(self.buffer.pauses + self.buffer.clears)
            info.clear_position = next((c for c in marks if c >= info.barge_in_onset), None)
        self._print_reply(info.turn)

    def _print_reply(self, turn: int) -> None:
        """`assistant: …` with `[stopped]` when the reply ended early, however it ended."""
        reply = turn_reply(self.store, self.conversation, turn)
        stopped = reply.interrupted or reply.outcome in (ev.ABORTED, ev.INTERRUPTED)
        if reply.delivered_text or stopped:
            self.transcript(" ".join(p for p in ("assistant:", reply.delivered_text, "[stopped]" if stopped else "")
                                     if p))
