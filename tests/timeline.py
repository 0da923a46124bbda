"""Scripted timelines run in process: the voice session as `voice replay`
assembles it (voice.service.replay), with the fakes of tests/fakes.py at
the speech Protocols, on the autojump virtual clock.

    outcome = run_timeline(Timeline(
        clips=[at(0.5, "three_points.wav", "Give me three points."),
               barge_in(1.1, "stop_only.wav", "Stop.")],
        replies=[{"text": "First point. Second point.", "chunk_delay_ms": 30}],
    ), tmp_path)
    outcome.events, outcome.played, outcome.turns, outcome.transcript, ...

Real: the Silero VAD (on the espeak fixtures, real speech), the pipecat
pipeline, the voice surface, barge-in control, the turn runner, the agent
loop with its SQLite log, the scripted provider and the replay device.
Fake: what the recogniser hears in each clip (`ScriptedStt`) and the
synthesized voice (`WordTts`: exact word boundaries).

`during(session)`, when given, runs beside the session (e.g. a typed
turn). The session is shut down (cancelled, as SIGTERM does it) as soon as
`shutdown_when(session)` holds (checked every 20 ms), else it ends with the
scenario.

The log is the real SQLite log; the harness only notes, for each event, the
speaker's sample position when it was written (`Outcome.position`), so the
log and the played audio can be read on one clock. A run fails if it
leaves a task or a thread behind, or if pipecat logs an error.

The clock: the autojump virtual clock of `voice replay`, installed for the
run only (it patches `time` process-wide; pytest's own timing uses
perf_counter, which it leaves alone). Idle waits cost nothing, so a 10 s
timeline runs in well under a second. Computing costs nothing either, as in
a recorded replay (`free_compute`): the Silero VAD and the loop's own work
take no time on this clock, and what the fakes are scripted to take
(`Said.compute_s`, `Timeline.synth_s`) they take on it exactly
(`virtual_compute`). So an outcome never depends on how fast or how loaded
the machine running the test is: a stop decided by its words rather than
by the voiced length of what followed it was, once, decided the other way
on a loaded CI machine, because the fake recogniser's job waited there for
a core while the mic blocks went on.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from loguru import logger

from fakes import Said, ScriptedStt, WordTts
from leaks import describe_tasks, describe_threads, tasks_left, threads_left
from voice.settings import Settings
from voice.agent.providers.scripted import ScriptedProvider, parse_replies
from voice.agent.tools.base import Tool
from voice.app import open_app
from voice.audio.clock import VirtualClock, run_on_virtual_clock
from voice.audio.replay_device import BLOCK, AudioLoss, ReplayDevice, UserClip
from voice.audio.wav import read_mono16k
from voice.config import defaults_path, load_config_with_sources
from voice.log.events import TURN_START, Event
from voice.log.projections import TurnReply, turn_reply
from voice.log.store import EventStore, new_conversation_id
from voice.logs import quiet_pipecat
from voice.service.scenario import Scenario, _onset
from voice.speech.builder import SpeechModels, build_voice_session
from voice.speech.session import VoiceSession
from voice.speech.settings import VoiceSettings
from voice.speech.turns import TurnInfo

AUDIO = Path(__file__).resolve().parent / "fixtures" / "audio"
RATE = 16000


@dataclass(frozen=True)
class Clip:
    file: str  # in tests/fixtures/audio
    said: Said
    when: str  # "at" | "barge_in_after" | "after_reply", as in a scenario file
    seconds: float


def at(seconds: float, file: str, text: str, *, doubtful: bool = False, compute_s: float = 0.0) -> Clip:
    """The clip starts `seconds` into the timeline; recognising it takes `compute_s`."""
    return Clip(file, Said(text, doubtful, compute_s), "at", seconds)


def barge_in(seconds: float, file: str, text: str, *, doubtful: bool = False) -> Clip:
    """The clip's speech begins `seconds` after the previous reply's first played sample."""
    return Clip(file, Said(text, doubtful), "barge_in_after", seconds)


def after_reply(seconds: float, file: str, text: str) -> Clip:
    """The clip starts `seconds` after the previous reply finished playing."""
    return Clip(file, Said(text), "after_reply", seconds)


@dataclass
class Timeline:
    clips: list[Clip]
    replies: list[dict[str, Any]]  # [[reply]] tables of a scripted LLM (voice.agent.providers.scripted)
    tools: list[Tool] = field(default_factory=list)
    word_ms: int = 200  # how long the fake voice says each word
    synth_s: float = 0.0  # how long the fake voice takes to synthesize a sentence
    tail: float = 1.5
    max_duration: float = 60.0
    shutdown_when: Callable[[VoiceSession], bool] | None = None  # checked every 20 ms (one speaker block)
    leaves_tasks: str | None = None  # why this run may leave pipecat's tasks behind (None: it may not)
    during: Callable[[VoiceSession], Awaitable[None]] | None = None
    keep: int | None = None  # per-turn bookkeeping the session holds (None: all, as `voice replay`)
    losses: tuple[AudioLoss, ...] = ()  # the sound card going and coming back, as a scenario's [[audio_lost]]


class PositionedStore(EventStore):
    """The real log, noting the speaker's position as each event is written."""

    def __init__(self, path: Path, device: ReplayDevice):
        super().__init__(path)
        self.device = device
        self.positions: dict[int, int] = {}  # seq -> device position (samples) when it was written
        publish = self.feed.publish  # every commit, however it was written, passes here

        def noted(event: Event) -> None:
            self.positions[event.seq] = self.device.position
            publish(event)

        self.feed.publish = noted  # type: ignore[method-assign]


@dataclass
class Outcome:
    events: list[Event]
    positions: dict[int, int]  # event seq -> the speaker's position (samples) when it was written
    replies: dict[int, TurnReply]  # turn -> what was generated, delivered, and how it ended
    history: list[dict[str, Any]]  # the model history the log now holds
    played: np.ndarray  # every sample the speaker played, on the mic clock
    mic: np.ndarray
    turns: list[TurnInfo]
    transcript: list[str]  # the lines a person reads (`you: …`, `assistant: …`)
    asides: list[str]  # what -v shows: heard and not acted on
    requests: list[list[dict[str, Any]]]  # every request the scripted model was sent
    tts: WordTts
    stt: ScriptedStt
    device: ReplayDevice
    conversation: str
    shutdown_at: int | None  # the speaker position (samples) where the shutdown began
    shutdown_took: float | None  # seconds from the shutdown until the session had ended

    def of_type(self, type_: str, turn: int | None = None) -> list[Event]:
        return [e for e in self.events if e.type == type_ and (turn is None or e.turn == turn)]

    def position(self, event: Event) -> int:
        return self.positions[event.seq]

    def spoken_by(self, text: str) -> set[int]:
        """The sample codes of every word the fake voice synthesized for `text` (a reply)."""
        return {code for code, w in self.tts.words.items() if w.text in text}

    def clip_onsets(self) -> list[int]:
        """Mic positions where each placed clip's speech begins."""
        return [p.onset for p in self.device.placed]


def default_config() -> dict[str, Any]:
    """The documented defaults, untouched by the user's file or environment."""
    return load_config_with_sources(defaults_path(), env={})[0]


def virtual_compute(clock: VirtualClock, loop: asyncio.AbstractEventLoop) -> Callable[[float], None]:
    """How a fake's executor job takes `seconds` of compute on the standing
    clock: it stops counting as in flight (so the clock may jump to the
    loop's timers meanwhile: mic blocks go on arriving, as they do while
    Whisper works) until a timer `seconds` after the job began has fired.
    The in-flight count is only ever changed on the loop's thread."""

    def spend(seconds: float) -> None:
        done = threading.Event()

        def finish() -> None:
            clock.begin()  # the job is computing again, until its future is done
            done.set()

        def wait() -> None:
            clock.end()
            loop.call_at(loop.time() + seconds, finish)

        loop.call_soon_threadsafe(wait)
        if not done.wait(timeout=60.0):
            raise AssertionError(f"a fake's {seconds} s of compute never came to an end on the virtual clock")

    return spend


def run_timeline(timeline: Timeline, tmp_path: Path, config: dict[str, Any] | None = None) -> Outcome:
    """Run the timeline to its end (or its shutdown) on the virtual clock.

    Fails if pipecat logs an error (it turns an exception in a processor
    into a log line), or if the run leaves a thread or (unless the timeline
    says why it may) a task behind: checked here as well as by conftest's
    fixture, since a module-scoped run starts before that one looks."""
    threads = set(threading.enumerate())
    errors: list[str] = []
    quiet_pipecat()
    sink = logger.add(lambda message: errors.append(str(message).strip()), level="ERROR")
    clock = VirtualClock()
    clock.install()
    clock.free_compute = True
    try:
        outcome = run_on_virtual_clock(_run(timeline, tmp_path, config or default_config(), clock), clock)
    finally:
        clock.uninstall()
        logger.remove(sink)
    assert not errors, f"pipecat logged errors: {errors}"
    left = threads_left(threads, grace_s=2.0)
    assert not left, f"the session left {len(left)} thread(s) running: {describe_threads(left)}"
    return outcome


async def _run(timeline: Timeline, tmp_path: Path, config: dict[str, Any], clock: VirtualClock) -> Outcome:
    before = asyncio.all_tasks()
    audio = {c.file: read_mono16k(AUDIO / c.file) for c in timeline.clips}
    users = tuple(UserClip(audio[c.file], c.file, c.when, c.seconds, _onset(audio[c.file])) for c in timeline.clips)
    scenario = Scenario(tmp_path / "timeline.toml", users, None, None, tail=timeline.tail,
                        max_duration=timeline.max_duration, losses=timeline.losses)
    running: list[VoiceSession] = []
    device = ReplayDevice(scenario, idle=lambda: bool(running) and running[0].idle())
    spend = virtual_compute(clock, asyncio.get_running_loop())
    stt = ScriptedStt(audio, {c.file: c.said for c in timeline.clips}, spend=spend)
    tts = WordTts(RATE, timeline.word_ms, timeline.synth_s, spend=spend)
    provider = ScriptedProvider(parse_replies(timeline.replies, "timeline"))
    transcript: list[str] = []
    asides: list[str] = []
    settings = VoiceSettings.from_settings(Settings.from_config(config), listen_mode="open")
    store = PositionedStore(tmp_path / "events.db", device)
    shutdown_at: int | None = None
    shutdown_began: float | None = None
    shutdown_took: float | None = None
    async with open_app(Settings.from_config(config), store=store, llm=provider, data_dir=tmp_path / "data", recovery=False) as app:
        for tool in timeline.tools:
            app.tools.add(tool)
        session = build_voice_session(app, device, SpeechModels(stt, tts), settings,
                                      conversation=new_conversation_id(), transcript=transcript.append,
                                      aside=asides.append, keep=timeline.keep)
        running.append(session)

        async def shut_down_when(condition: Callable[[VoiceSession], bool], scope: anyio.CancelScope) -> None:
            nonlocal shutdown_at, shutdown_began
            while not condition(session):
                await anyio.sleep(BLOCK / RATE)
            shutdown_at, shutdown_began = device.position, anyio.current_time()
            scope.cancel()

        async def run_session(beside: anyio.CancelScope) -> None:
            nonlocal shutdown_took
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as watch:
                    if timeline.shutdown_when is not None:
                        watch.start_soon(shut_down_when, timeline.shutdown_when, scope)
                    await session.run()
                    watch.cancel_scope.cancel()  # the scenario ended first
            if shutdown_began is not None:
                shutdown_took = anyio.current_time() - shutdown_began
            beside.cancel()  # the session is over: so is what ran beside it

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_session, tg.cancel_scope)
            if timeline.during is not None:
                tg.start_soon(timeline.during, session)
        events = app.store.events(session.conversation)
        history = session.history()
        replies = {e.turn: turn_reply(app.store, session.conversation, e.turn) for e in events
                   if e.type == TURN_START}
    left = await tasks_left(before, grace_s=0.5)
    if left and timeline.leaves_tasks:  # allowed, and said why: ended here, before the loop closes
        for task in left:
            task.cancel()
        await asyncio.wait(left, timeout=1.0)
    else:
        assert not left, f"the session left {len(left)} task(s) running: {describe_tasks(left)}"
    return Outcome(events=events, positions=dict(store.positions), replies=replies, history=history,
                   played=device.played(), mic=device.mic(), turns=list(session.turns), transcript=transcript,
                   asides=asides, requests=[list(r.messages) for r in provider.requests], tts=tts, stt=stt,
                   device=device, conversation=session.conversation, shutdown_at=shutdown_at,
                   shutdown_took=shutdown_took)
