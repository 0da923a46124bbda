"""`voice run`: the voice session on the sound card until SIGINT/SIGTERM.

A signal is a shutdown: the running turn is cancelled and closed
`interrupted` with its delivered prefix recorded, then the pipeline drains.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from voice.errors import UsageError
from voice.log.store import EventStore


def _load(what: str, load):
    print(f"loading {what}…", end="", file=sys.stderr, flush=True)
    started = time.perf_counter()
    value = load()
    print(f" {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return value


def run_live(config: dict[str, Any], store: EventStore, llm_spec: str | None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from voice.logs import quiet_pipecat

    quiet_pipecat()

    import anyio

    from voice.agent.providers import make_provider, open_provider
    from voice.audio.live import AudioUnavailable, LiveDevice
    from voice.log.store import new_conversation_id
    from voice.speech.models import ModelMissing
    from voice.speech.session import VadSettings, VoiceSession
    from voice.speech.stt import WhisperEngine
    from voice.speech.tts import PiperEngine
    from voice.runtime import build_runtime, loop_settings, start

    spec = llm_spec or config["llm"]["provider"]
    make_provider(spec, config)  # a bad --llm fails before the models load
    audio = config["audio"]
    try:
        device = LiveDevice(audio["input"] or None, audio["output"] or None)
    except AudioUnavailable as exc:
        raise UsageError(str(exc)) from None
    try:
        stt = _load(f"speech recognition (whisper {config['stt']['model']})",
                    lambda: WhisperEngine(config["stt"]["model"], config["stt"]["threads"]))
        tts = _load("speech synthesis (piper en_US-joe-medium)",
                    lambda: PiperEngine(device.out_rate, alignments=config["tts"]["alignments"]))
    except (ModelMissing, ValueError) as exc:
        raise UsageError(str(exc)) from None
    session: VoiceSession | None = None

    async def announce(text: str) -> None:
        if session is not None:
            await session.surface.notice(text)

    runtime = build_runtime(config, store, announce)

    async def main() -> None:
        nonlocal session
        provider = await open_provider(spec, config, notice=lambda text: print(text, file=sys.stderr, flush=True))
        await start(runtime)
        session = VoiceSession(
            store=store, provider=provider, tools=runtime.tools, settings=loop_settings(config),
            conversation=store.latest_conversation() or new_conversation_id(),
            device=device, stt=stt, tts=tts, vad=VadSettings(**config["vad"]),
            tool_env=runtime.env, timers=runtime.timers,
        )
        async with anyio.create_task_group() as tg:

            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        print("\nstopping…", file=sys.stderr, flush=True)
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(on_signal)
            print(f"listening ({device.describe()}); Ctrl-C to stop", file=sys.stderr, flush=True)
            await session.run()

    try:
        anyio.run(main)
    finally:
        store.close()
    return 0
