"""`voice run`: the assistant as a service, on the sound card or (with
`--replay SCENARIO`) on the replay device, paced in real time and kept up
after the scenario's audio ends until it is stopped.

Lifecycle: READY=1 once the models are loaded and the audio is open;
WATCHDOG=1 only while the pipeline's own heartbeat advances (mic blocks
reach the VAD), so a stalled pipeline is restarted by systemd, not kept
alive by a healthy-looking process; STOPPING=1 on SIGTERM/SIGINT, then the
cancellation protocol (the turn is closed `interrupted` with its delivered
prefix recorded, tools terminated) and exit 0 within `shutdown_s`.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from voice.errors import UsageError
from voice.log.store import EventStore
from voice.service.notify import notify, watchdog, watchdog_interval


def _open_device(config: dict[str, Any], replay: Path | None, idle):
    from voice.audio.live import AudioUnavailable, LiveDevice

    if replay is not None:
        from voice.audio.replay import ReplayDevice
        from voice.audio.scenario import load_scenario

        try:
            scenario = load_scenario(replay)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return ReplayDevice(scenario, idle=idle, realtime=True, hold=True), scenario
    audio = config["audio"]
    try:
        return LiveDevice(audio["input"] or None, audio["output"] or None), None
    except AudioUnavailable as exc:
        raise UsageError(str(exc)) from None


def _how_to_talk(session) -> str:
    """What the person must say first, named as it is said."""
    if session.wake_word is None:
        return "every utterance is a request ([listen] mode = open)"
    return (f'say "{session.wake_word.replace("_", " ")}" first (wake word; [listen] wake_word), then your request; '
            f"follow-ups within {session.listen_mode.window_s:g} s need none")


def run_daemon(config: dict[str, Any], store: EventStore, llm_spec: str | None, replay: Path | None = None,
               verbose: bool = False) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from voice.logs import quiet_pipecat

    quiet_pipecat()

    from voice.agent.providers import make_provider, open_provider
    from voice.agent.providers.scripted import ScriptedProvider
    from voice.log.store import new_conversation_id
    from voice.runtime import build_runtime, loop_settings, start
    from voice.service.control import ControlServer, checked_socket_path
    from voice.speech.models import ModelMissing, load_with_progress
    from voice.speech.session import BargeInSettings, ListenSettings, VadSettings, VoiceSession
    from voice.speech.stt import WhisperEngine
    from voice.speech.tts import PiperEngine

    checked_socket_path(config)  # a socket directory that is not private fails before the models load
    session: VoiceSession | None = None
    device, scenario = _open_device(config, replay, idle=lambda: session is not None and session.idle())
    spec = llm_spec or config["llm"]["provider"]
    if not (scenario and scenario.replies is not None):
        make_provider(spec, config)  # a bad --llm fails before the models load
    try:
        stt = load_with_progress(f"speech recognition (whisper {config['stt']['model']})",
                    lambda: WhisperEngine(config["stt"]["model"], config["stt"]["threads"]))
        tts = load_with_progress("speech synthesis (piper en_US-joe-medium)",
                    lambda: PiperEngine(device.out_rate, alignments=config["tts"]["alignments"]))
    except (ModelMissing, ValueError) as exc:
        raise UsageError(str(exc)) from None

    async def announce(text: str) -> None:
        if session is not None:
            await session.surface.notice(text)

    runtime = build_runtime(config, store, announce)
    listen_mode = ListenSettings(**config["listen"])
    if scenario is not None:  # a replayed scenario says how it listens ("open" unless it sets [listen] mode)
        listen_mode = ListenSettings(scenario.listen_mode, config["listen"]["wake_word"],
                                     scenario.window_s or config["listen"]["window_s"])
    echo = None
    if config["audio"]["echo_cancellation"]:
        from voice.audio.echo import EchoCanceller, EchoUnavailable

        try:
            echo = EchoCanceller()
        except EchoUnavailable as exc:  # run without it, but say so: laptop speakers will cut replies short
            print(f"voice: warning: {exc}; use a headset", file=sys.stderr, flush=True)
    shutdown_s = config["service"]["shutdown_s"]

    async def main() -> None:
        nonlocal session
        if scenario is not None and scenario.replies is not None:
            provider = ScriptedProvider(list(scenario.replies), name=scenario.path.name)
        else:
            provider = await open_provider(spec, config, notice=lambda text: print(text, file=sys.stderr, flush=True))
        await start(runtime)
        session = VoiceSession(
            store=store, provider=provider, tools=runtime.tools, settings=loop_settings(config),
            conversation=store.latest_conversation() or new_conversation_id(),
            device=device, stt=stt, tts=tts, vad=VadSettings(**config["vad"]),
            barge_in=BargeInSettings(**config["barge_in"]), listen_mode=listen_mode,
            tool_env=runtime.env, timers=runtime.timers, shutdown_s=shutdown_s, echo=echo,
            aside=(lambda line: print(line, flush=True)) if verbose else None,
        )
        control = ControlServer(session, config)
        async with anyio.create_task_group() as tg:

            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        notify("STOPPING=1")
                        print("stopping…", file=sys.stderr, flush=True)
                        tg.cancel_scope.cancel()
                        return

            async def heartbeat() -> None:
                """WATCHDOG=1 only while mic audio keeps reaching the VAD."""
                interval = watchdog_interval()
                if interval is not None:
                    await watchdog(lambda: session.listen.position, interval)

            async def ready() -> None:
                while session.listen.position == 0:  # audio is flowing through the pipeline
                    await anyio.sleep(0.02)
                notify("READY=1")
                print(f"listening ({device.describe()}); {_how_to_talk(session)}; control socket {control.path}",
                      file=sys.stderr, flush=True)

            tg.start_soon(on_signal)
            tg.start_soon(heartbeat)
            tg.start_soon(ready)
            await tg.start(control.serve)
            await session.run()
            tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        store.close()
    return 0
