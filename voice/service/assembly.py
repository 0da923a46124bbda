"""One voice assembly: `open_voice`, a voice session on top of `open_app`.

`voice run` and `voice replay` (and a new voice entry point) are a few lines
on top of it: they choose the device and what the session keeps, and run
the session. In this order:

1. the provider (open_app: a bad --llm fails before anything else);
2. the log and the rest of open_app (recovery, tools, MCP servers, timers),
   and the speech models (Whisper, Piper, the echo canceller) in a worker
   thread, off the event loop: the log first for the service (a log it
   cannot use fails before seconds of loading), the models first for a
   replay (`models_first`: one that cannot load leaves no log in --out);
3. the session on the device, in the conversation it answers in.

A replayed scenario (`scenario`) says how the session listens ("open"
unless it sets [listen] mode), and its scripted replies are the provider,
clocked on the device's position.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio

from voice.app import App, open_app
from voice.audio.device import MIC_RATE, AudioDevice
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


@asynccontextmanager
async def open_voice(settings: Settings, device: AudioDevice, *, scenario: Scenario | None = None,
                     llm: str | None = None, stt_model: str | None = None, echo: bool | None = None,
                     echo_required: bool = False, models_first: bool = False, resume: bool = True,
                     tools: Sequence[Any] = (), recorder: Any = None, keep: int | None = 64,
                     keep_units: int | None = None, verbose: bool = False,
                     hold: Callable[[], AbstractContextManager[object]] | None = None,
                     db: str | Path | None = None, **app_options: Any) -> AsyncIterator[Voice]:
    """A voice session on `device`, answering through an app opened on
    `settings` (see the module docstring).

    `llm`: the provider spec (default: the config's; a scenario's scripted
    replies go first); `stt_model`, `echo`: over the config's [stt] model and
    [audio] echo_cancellation; `echo_required`: no echo canceller is an error,
    not a warning; `models_first`: see the module docstring; `resume`: the
    latest conversation unless it ended or was idle past the gap (else a
    new one); `tools`: added to the app's (a
    replay's stand-ins); `recorder`, `keep`, `keep_units`: see build_voice_session;
    `hold`: around work the event loop cannot see (a replay's clock);
    `db` and `app_options` go to open_app."""
    voice_settings = (VoiceSettings.from_settings(settings) if scenario is None else  # "open" unless it says
                      VoiceSettings.from_settings(settings, listen_mode=scenario.listen_mode,
                                                  window_s=scenario.window_s))
    scripted = None
    if scenario is not None:  # a scenario's sound is a replay's: its replies are timed on the replay's mic clock
        if not isinstance(device, ReplayDevice):
            raise TypeError(f"a scenario plays on a ReplayDevice, not on {device.describe()}")
        replay = device
        scripted = scenario.scripted_provider(clock=lambda: replay.position / MIC_RATE)
    echo = settings.audio.echo_cancellation if echo is None else echo
    held = hold or nullcontext

    async def load():  # blocking for seconds: in a worker thread, so the loop (signals, the clock) goes on
        with held():
            return await anyio.to_thread.run_sync(lambda: load_models(
                settings, device.out_rate, stt_model=stt_model, echo_cancellation=echo, echo_required=echo_required))

    async with open_app(settings, db=db, llm=scripted or llm, hold=hold, before_log=load if models_first else None,
                        **app_options) as app:
        models = app.prepared if models_first else await load()
        for tool in tools:
            app.tools.add(tool)
        conversation = resume_or_new(app.store, settings.conversation.idle_gap_s) if resume else new_conversation_id()
        session = build_voice_session(app, device, models, voice_settings, conversation=conversation,
                                      aside=(lambda line: print(line, flush=True)) if verbose else None,
                                      recorder=recorder, keep=keep, keep_units=keep_units,
                                      play_at=scenario.play_at(device.out_rate) if scenario else None)
        if isinstance(device, ReplayDevice):
            device.idle = session.idle  # it asks whether all is quiet before the next clip
        listen = voice_settings.listen
        as_run = replace(settings, audio=replace(settings.audio, echo_cancellation=session.echo is not None),
                         listen=replace(settings.listen, mode=listen.mode, window_s=listen.window_s))
        yield Voice(app, session, device, as_run)
