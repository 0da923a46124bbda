"""`voice run`: the assistant as a service, on the sound card or (with
`--replay SCENARIO`) on the replay device, paced in real time and kept up
after the scenario's audio ends until it is stopped.

Lifecycle: READY=1 once the models are loaded and mic audio reaches the VAD
(or, with no sound device yet, once the control socket answers: the device is
waited for, `STATUS=waiting for a sound device`);
WATCHDOG=1 only while the pipeline's own heartbeat advances (mic blocks
reach the VAD) or, while the sound card is lost, the live device keeps
trying to reopen it (voice.audio.stream_life: alive and trying is not
hung), so a stalled pipeline is restarted by systemd, not kept alive by a
healthy-looking process; STOPPING=1 on SIGTERM/SIGINT, then the
cancellation protocol (the turn is closed `interrupted` with its delivered
prefix recorded, tools terminated) and exit 0 within `shutdown_s`.

Recording (voice.audio.recording, voice.service.recording): with `--record
DIR` the whole session's sound goes to DIR as it comes, and at the end the
session's events, a scenario.toml and config.toml join it. Without it the
last `[record] ring_s` seconds stay in memory for `voice ctl save DIR`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus

from voice.agent.approvals import unanswered
from voice.audio.device import AudioDevice
from voice.errors import Failed, UsageError, as_usage_error
from voice.service.notify import notify, watchdog, watchdog_interval
from voice.service.signals import cancel_on_signal
from voice.settings import Settings

HOLD_SILENCE_S = 1.0  # the most a silent mic block waits while the service waits (1 loop wake-up a second)
DEVICE_BLOCK_MS = 32  # the sound card's block: Silero's 512-sample window at 16 kHz


def _open_device(settings: Settings, replay: Path | None, recording: bool = False):
    """The sound card, or with --replay the replay device, paced in real time
    and kept up after the scenario (and the scenario)."""
    from voice.audio.live import AudioUnavailable, LiveDevice

    if replay is not None:
        from voice.audio.replay_device import ReplayDevice
        from voice.service.assembly import not_yet_idle
        from voice.service.scenario import load_scenario

        with as_usage_error(ValueError):
            scenario = load_scenario(replay)
        return ReplayDevice(scenario, idle=not_yet_idle, realtime=True, hold=True), scenario
    from voice.speech.vad_gate import LEVEL_FLOOR_DBFS  # here: importing speech loads pipecat, which prints a banner

    with as_usage_error(AudioUnavailable):
        # 32 ms blocks, one Silero frame each: idle CPU 4 % against 6 % at 20 ms; silence held
        # back up to HOLD_SILENCE_S while the service waits (voice.audio.silence_hold; benchmarks/RESULTS.md)
        # With the system's default devices, none at start is waited for (the audio server may start
        # after us); a pinned one that is not there is a mistake in the config, said at once. So is a
        # card that will not open for `--record`: a person at a terminal asked to record it now (#27).
        pinned = bool(settings.audio.input or settings.audio.output)
        return LiveDevice(settings.audio.input or None, settings.audio.output or None, block_ms=DEVICE_BLOCK_MS,
                          hold_silence_s=HOLD_SILENCE_S, hold_floor_dbfs=LEVEL_FLOOR_DBFS - 6,
                          wait_for_audio=not pinned and not recording), None


def _recorder(ring_s: float, record: Path | None):
    from voice.audio.recording import Recorder

    if record is None:
        return Recorder.ring(ring_s)
    blocker = next((p for p in record.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UsageError(f"--record: cannot create {record}: {blocker} is a file, not a directory; "
                         "give a new directory, e.g. --record ~/voice-bug")
    try:
        return Recorder.to_directory(record)
    except ValueError as exc:
        raise UsageError(f"--record: {exc}") from None
    except OSError as exc:  # one line, not "[Errno 13] ...": what failed and what to do
        raise UsageError(f"--record: cannot create {exc.filename or record}: {exc.strerror or exc}; give a "
                         "directory you can write, e.g. --record ~/voice-bug") from None


def _made_by_us(record: Path | None) -> Path | None:
    """The outermost folder of `record` that does not exist yet: what a start-up
    that fails must take away again (None when `record` is there already)."""
    if record is None or record.exists():
        return None
    made = record
    while not made.parent.exists():
        made = made.parent
    return made


def _undo_recording(recorder, record: Path, made: Path | None) -> None:
    """Start-up failed: nothing was recorded, so nothing of the recording stays."""
    import shutil

    recorder.close()
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        return
    for name in ("mic.wav", "played.wav", "mic_blocks.txt"):  # the folder was there, empty: empty it again
        (record / name).unlink(missing_ok=True)


def _how_to_talk(session) -> str:
    """What the person must say first, named as it is said."""
    listen = session.settings.listen
    if session.wake_word is None:
        return "every utterance is a request ([listen] mode = open)"
    return (f'say "{session.wake_word.replace("_", " ")}" first (wake word; [listen] wake_word), then your request; '
            f"follow-ups within {listen.window_s:g} s need none")


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _stopping() -> bool:
    notify("STOPPING=1")
    _stderr("stopping…")
    return True


async def _run_session(session, scope: anyio.CancelScope, *, task_status: TaskStatus[None]) -> None:
    from voice.audio.live import AudioUnavailable

    try:
        await session.run(task_status=task_status)  # started once mic audio reaches the VAD
    except* AudioUnavailable as failed:  # a card that will not open (in the session's task group): its one line
        raise UsageError(str(failed.exceptions[0])) from None
    # The device ended: so does the service. Only here, not on an error: cancelling the
    # task group that awaits `start` lost the error (exit 0, "recorded 0.0 s").
    scope.cancel()


@dataclass
class _Daemon:
    """One `voice run`: what was opened before the event loop, and whether
    the session came to listen (until then a start-up that fails takes its
    recording folder away)."""

    settings: Settings
    socket: Path
    device: AudioDevice
    scenario: Any
    recorder: Any
    record: Path | None
    db: str | None
    llm: str | None
    verbose: bool
    started: bool = False

    async def main(self) -> None:
        from voice.service.assembly import AppState, Keeping, VoiceOptions, open_voice
        from voice.service.control import ControlServer

        options = VoiceOptions(scenario=self.scenario, llm=self.llm,
                               keeping=Keeping(recorder=self.recorder, verbose=self.verbose),
                               state=AppState(db=self.db, notice=_stderr))
        async with open_voice(self.settings, self.device, options) as voice:
            since = voice.app.store.last_seq()  # a recording holds this session's events, not the conversation's past
            session = voice.session
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(cancel_on_signal, tg.cancel_scope, on_signal=_stopping))
                await tg.start(ControlServer(session, self.socket, save=partial(self.save, voice, since)).serve)
                interval = watchdog_interval()
                if interval is not None:  # WATCHDOG=1 only while mic audio keeps reaching the VAD,
                    # or, while the sound card is lost (or not there yet), the device keeps trying to open it
                    tg.start_soon(watchdog, lambda: (session.listen.position, self.device.retries),
                                  interval)
                waiting = self.device.audio_lost()
                if waiting is not None:  # no sound device yet (the audio server starts after us): started, and
                    # saying so, so that systemd does not time the start out while the device is waited for
                    notify("READY=1")
                    notify("STATUS=waiting for a sound device")
                    _stderr(f"waiting for a sound device ({waiting['reason']}); the control socket {self.socket} "
                            "answers meanwhile")
                await tg.start(_run_session, session, tg.cancel_scope)
                notify("READY=1")
                notify("STATUS=listening")
                self.started = True
                _stderr(f"listening ({self.device.describe()}); {_how_to_talk(session)}; control socket {self.socket}")
                for _, asked in unanswered(voice.app.store, session.conversation,  # a crash left it: asked again first
                                           expire_s=self.settings.conversation.idle_gap_s):
                    tg.start_soon(session.ask_again, asked)
            if self.record is not None:  # the session has ended: its events and scenario join the sound
                self.save_record(voice, since)

    def save(self, voice, since: int, directory: Path) -> dict[str, Any]:
        """`voice ctl save DIR`: the ring's last minutes, with their events."""
        from voice.service.recording import save_session

        if self.recorder is None:
            raise ValueError("nothing is kept to save: [record] ring_s is 0 (set it above 0, or record the "
                             "whole session with voice run --record DIR)")
        if self.record is not None:
            raise ValueError(f"this session records everything to {self.record}: it is complete there once "
                             "the service stops")
        return save_session(directory, self.recorder, voice.app.store, voice.settings, since_seq=since)

    def save_record(self, voice, since: int) -> None:
        from voice.service.recording import save_session

        try:
            saved = save_session(self.record, self.recorder, voice.app.store, voice.settings, since_seq=since)
        except (OSError, ValueError) as exc:  # the sound is there already; say what is missing
            raise Failed(f"the recording in {self.record} lacks its log and scenario: {exc}") from None
        _stderr(f"recorded {saved['seconds']} s to {self.record}; replay it with: "
                f"voice replay {self.record}/scenario.toml --out OUT")


def run_daemon(settings: Settings, db: str | None, llm_spec: str | None, replay: Path | None = None,
               verbose: bool = False, record: Path | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from voice.logs import quiet_pipecat

    quiet_pipecat()

    from voice.service.control import checked_socket_path

    socket = checked_socket_path(settings.service.socket_path)  # not private: fails before the models load
    device, scenario = _open_device(settings, replay, recording=record is not None)
    made = _made_by_us(record)
    recorder = _recorder(settings.record.ring_s, record)  # a --record directory it cannot use: before the models load
    daemon = _Daemon(settings, socket, device, scenario, recorder, record, db, llm_spec, verbose)
    try:
        anyio.run(daemon.main)
    except BaseException:
        if record is not None and not daemon.started:
            _undo_recording(recorder, record, made)
        raise
    return 0
