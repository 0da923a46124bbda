"""`voice run`: the assistant as a service, on the sound card or (with
`--replay SCENARIO`) on the replay device, paced in real time and kept up
after the scenario's audio ends until it is stopped.

Lifecycle: READY=1 once the models are loaded and mic audio reaches the VAD;
WATCHDOG=1 only while the pipeline's own heartbeat advances (mic blocks
reach the VAD), so a stalled pipeline is restarted by systemd, not kept
alive by a healthy-looking process; STOPPING=1 on SIGTERM/SIGINT, then the
cancellation protocol (the turn is closed `interrupted` with its delivered
prefix recorded, tools terminated) and exit 0 within `shutdown_s`.

Recording (voice.audio.recording, voice.service.recording): with `--record
DIR` the whole session's sound goes to DIR as it comes, and at the end the
session's events, a scenario.toml and config.toml join it. Without it the
last `[record] ring_s` seconds stay in memory for `voice ctl save DIR`.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus

from voice.agent.approvals import unanswered
from voice.audio.device import MIC_RATE
from voice.errors import Failed, UsageError
from voice.service.notify import notify, watchdog, watchdog_interval


def _open_device(config: dict[str, Any], replay: Path | None, idle):
    from voice.audio.live import AudioUnavailable, LiveDevice

    if replay is not None:
        from voice.audio.replay_device import ReplayDevice
        from voice.service.scenario import load_scenario

        try:
            scenario = load_scenario(replay)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return ReplayDevice(scenario, idle=idle, realtime=True, hold=True), scenario
    audio = config["audio"]
    try:
        # 32 ms blocks, one Silero frame each: idle CPU 4 % against 6 % at 20 ms (benchmarks/RESULTS.md)
        return LiveDevice(audio["input"] or None, audio["output"] or None, block_ms=32), None
    except AudioUnavailable as exc:
        raise UsageError(str(exc)) from None


def _recorder(config: dict[str, Any], record: Path | None):
    from voice.audio.recording import Recorder

    if record is None:
        return Recorder.ring(config["record"]["ring_s"])
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


def run_daemon(config: dict[str, Any], db: str | None, llm_spec: str | None, replay: Path | None = None,
               verbose: bool = False, record: Path | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from voice.logs import quiet_pipecat

    quiet_pipecat()

    from voice.app import open_app
    from voice.log.conversations import resume_or_new
    from voice.service.control import ControlServer, checked_socket_path
    from voice.service.recording import save_session

    def as_run(session) -> dict[str, Any]:
        """The config as the session really runs it (a replayed scenario sets its own listen mode)."""
        listen = session.settings.listen
        effective = {**config, "audio": {**config["audio"], "echo_cancellation": session.echo is not None}}
        if listen is not None:
            effective["listen"] = {**config["listen"], "mode": listen.mode, "window_s": listen.window_s}
        return effective
    from voice.speech.builder import build_voice_session, load_models
    from voice.speech.settings import VoiceSettings

    checked_socket_path(config)  # a socket directory that is not private fails before the models load
    running: list[Any] = []  # the session, once built (the replay device asks it whether all is quiet)
    device, scenario = _open_device(config, replay, idle=lambda: bool(running) and running[0].idle())
    settings = VoiceSettings.from_config(config)
    if scenario is not None:  # a replayed scenario says how it listens ("open" unless it sets [listen] mode)
        settings = VoiceSettings.from_config(config, listen_mode=scenario.listen_mode, window_s=scenario.window_s)
    llm: Any = (scenario.scripted_provider(clock=lambda: device.position / MIC_RATE) if scenario is not None
                else None) or llm_spec

    made = _made_by_us(record)
    recorder = _recorder(config, record)  # a --record directory it cannot use fails before the models load
    started = False  # until the session listens: a start-up that fails takes its recording folder away

    async def main() -> None:
        nonlocal started
        async with open_app(config, db=db, llm=llm, notice=_stderr) as app:  # a bad --llm fails before the models load
            models = load_models(config, device.out_rate, echo_cancellation=config["audio"]["echo_cancellation"],
                                 echo_required=False)
            session = build_voice_session(
                app, device, models, settings, conversation=resume_or_new(app.store, config["conversation"]["idle_gap_s"]),
                aside=(lambda line: print(line, flush=True)) if verbose else None, recorder=recorder,
                play_at=scenario.play_at(device.out_rate) if scenario is not None else None)
            running.append(session)
            since = app.store.last_seq()  # a recording holds this session's events, not the conversation's past

            def save(directory: Path) -> dict[str, Any]:
                if recorder is None:
                    raise ValueError("nothing is kept to save: [record] ring_s is 0 (set it above 0, or record the "
                                     "whole session with voice run --record DIR)")
                if record is not None:
                    raise ValueError(f"this session records everything to {record}: it is complete there once "
                                     "the service stops")
                return save_session(directory, recorder, app.store, as_run(session),
                                    since_seq=since)

            control = ControlServer(session, config, save=save)
            async with anyio.create_task_group() as tg:

                async def on_signal() -> None:
                    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                        async for _ in signals:
                            notify("STOPPING=1")
                            _stderr("stopping…")
                            tg.cancel_scope.cancel()
                            return

                async def run_session(*, task_status: TaskStatus[None]) -> None:
                    try:
                        await session.run(task_status=task_status)
                    finally:
                        tg.cancel_scope.cancel()  # the device ended: so does the service

                tg.start_soon(on_signal)
                await tg.start(control.serve)
                await tg.start(run_session)  # returns once mic audio reaches the VAD
                notify("READY=1")
                started = True
                _stderr(f"listening ({device.describe()}); {_how_to_talk(session)}; control socket {control.path}")
                for _, asked in unanswered(app.store, session.conversation,  # a crash left it: asked again first
                                           expire_s=config["conversation"]["idle_gap_s"]):
                    tg.start_soon(session.ask_again, asked)
                interval = watchdog_interval()
                if interval is not None:  # WATCHDOG=1 only while mic audio keeps reaching the VAD
                    tg.start_soon(watchdog, lambda: session.listen.position, interval)
            if record is not None:  # the session has ended: its events and scenario join the sound
                try:
                    saved = save_session(record, recorder, app.store, as_run(session),
                                         since_seq=since)
                except (OSError, ValueError) as exc:  # the sound is there already; say what is missing
                    raise Failed(f"the recording in {record} lacks its log and scenario: {exc}") from None
                _stderr(f"recorded {saved['seconds']} s to {record}; replay it with: "
                        f"voice replay {record}/scenario.toml --out OUT")

    try:
        anyio.run(main)
    except BaseException:
        if record is not None and not started:
            _undo_recording(recorder, record, made)
        raise
    return 0
