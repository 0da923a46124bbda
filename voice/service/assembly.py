"""One voice assembly: `open_voice`, a voice session on top of `open_app`.

`voice run` and `voice replay` (and a new voice entry point) are a few lines
on top of it: they choose the device and what the session keeps, and run
the session. In this order:

1. the provider (open_app: a bad --llm fails before anything else);
2. the log and the rest of open_app (recovery, tools, MCP servers, timers),
   and the speech models (Whisper, Piper, the echo canceller) in a worker
   thread, off the event loop: the log first for the service (a log it
   cannot use fails before seconds of loading), the models first for a
   replay (`SpeechModelChoice.before_log`: one that cannot load leaves no log in --out);
3. the session on the device, in the conversation it answers in.

A replayed scenario (`scenario`) says how the session listens ("open"
unless it sets [listen] mode), and its scripted replies are the provider,
clocked on the device's position.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio

from voice.agent.tools.base import Tool
from voice.app import App, open_app
from voice.audio.device import MIC_RATE, AudioDevice
from voice.audio.recording import Recorder
from voice.audio.replay_device import ReplayDevice
from voice.log.conversations import resume_or_new
from voice.log.store import new_conversation_id
from voice.service.scenario import Scenario
from voice.settings import Settings
from voice.speech.builder import build_voice_session, load_models
from voice.speech.session import VoiceSession
from voice.speech.settings import VoiceSettings


def not_yet_idle() -> bool:
    """A replay device's `idle` until open_voice gives it the session's (the
    session is built on the device, so it exists only afterwards)."""
    return False


@dataclass(frozen=True)
class Voice:
    app: App
    session: VoiceSession
    device: AudioDevice
    settings: Settings  # as the session runs them (what a recording saves): the scenario's listen mode, the AEC


@dataclass(frozen=True)
class SpeechModelChoice:
    """Which speech models, over the config's, and when they load."""

    stt_model: str | None = None  # over [stt] model
    echo: bool | None = None  # over [audio] echo_cancellation
    echo_required: bool = False  # no echo canceller is an error, not a warning
    # Before the log, not after it (see the module docstring): one that cannot load leaves no log behind.
    before_log: bool = False


@dataclass(frozen=True)
class Keeping:
    """What the session keeps and shows (see build_voice_session)."""

    recorder: Recorder | None = None  # the session's sound
    keep: int | None = 64  # turns' bookkeeping (None: all, for a finite replay's summary)
    keep_units: int | None = None  # the voice surface's messages
    verbose: bool = False  # what was heard and not acted on, as asides


@dataclass(frozen=True)
class AppState:
    """Where the app keeps its state and what of it starts (voice.app.open_app)."""

    db: str | Path | None = None  # the log (default: the config's)
    data_dir: Path | None = None  # notes (default: the XDG data folder)
    grants: Path | None = None  # "always" answers (default: the XDG state folder)
    recovery: bool = True  # start-up recovery of a log a crash left (a replay's fresh log has none)
    mcp: bool = True  # the configured MCP servers (a replay's recorded results stand in for them)
    notice: Callable[[str], None] = lambda text: None  # how the provider was chosen


@dataclass(frozen=True)
class VoiceOptions:
    """How `open_voice` opens a voice session, by what each choice is about."""

    scenario: Scenario | None = None  # a replayed scenario: its listen mode and scripted replies
    llm: str | None = None  # the provider spec (default: the config's; a scenario's scripted replies go first)
    resume: bool = True  # the latest conversation unless it ended or was idle past the gap (else a new one)
    tools: tuple[Tool, ...] = ()  # added to the app's (a replay's stand-ins)
    hold: Callable[[], AbstractContextManager[object]] | None = None  # around work the loop cannot see (a replay's clock)
    models: SpeechModelChoice = field(default_factory=SpeechModelChoice)
    keeping: Keeping = field(default_factory=Keeping)
    state: AppState = field(default_factory=AppState)


@asynccontextmanager
async def open_voice(settings: Settings, device: AudioDevice,
                     options: VoiceOptions = VoiceOptions()) -> AsyncIterator[Voice]:
    """A voice session on `device`, answering through an app opened on
    `settings` as `options` say (see the module docstring)."""
    scenario, models, keeping = options.scenario, options.models, options.keeping
    voice_settings = (VoiceSettings.from_settings(settings) if scenario is None else  # "open" unless it says
                      VoiceSettings.from_settings(settings, listen_mode=scenario.listen_mode,
                                                  window_s=scenario.window_s))
    scripted = None
    if scenario is not None:  # a scenario's sound is a replay's: its replies are timed on the replay's mic clock
        if not isinstance(device, ReplayDevice):
            raise TypeError(f"a scenario plays on a ReplayDevice, not on {device.describe()}")
        replay = device
        scripted = scenario.scripted_provider(clock=lambda: replay.position / MIC_RATE)
    echo = settings.audio.echo_cancellation if models.echo is None else models.echo
    held = options.hold or nullcontext

    async def load():  # blocking for seconds: in a worker thread, so the loop (signals, the clock) goes on
        with held():
            return await anyio.to_thread.run_sync(lambda: load_models(
                settings, device.out_rate, stt_model=models.stt_model, echo_cancellation=echo,
                echo_required=models.echo_required))

    state = options.state
    async with open_app(settings, db=state.db, data_dir=state.data_dir, grants=state.grants,
                        recovery=state.recovery, mcp=state.mcp, notice=state.notice, llm=scripted or options.llm,
                        hold=options.hold, before_log=load if models.before_log else None) as app:
        loaded = app.prepared if models.before_log else await load()
        for tool in options.tools:
            app.tools.add(tool)
        conversation = (resume_or_new(app.store, settings.conversation.idle_gap_s) if options.resume
                        else new_conversation_id())
        session = build_voice_session(app, device, loaded, voice_settings, conversation=conversation,
                                      aside=(lambda line: print(line, flush=True)) if keeping.verbose else None,
                                      recorder=keeping.recorder, keep=keeping.keep, keep_units=keeping.keep_units,
                                      play_at=scenario.play_at(device.out_rate) if scenario else None)
        if isinstance(device, ReplayDevice):
            device.idle = session.idle  # it asks whether all is quiet before the next clip
        listen = voice_settings.listen
        as_run = replace(settings, audio=replace(settings.audio, echo_cancellation=session.echo is not None),
                         listen=replace(settings.listen, mode=listen.mode, window_s=listen.window_s))
        yield Voice(app, session, device, as_run)
