"""`voice replay SCENARIO --out DIR`: a scenario through the same pipeline the
live service runs, with the replay device on the autojump clock.

Writes DIR/mic.wav and DIR/played.wav (same 16 kHz sample clock),
DIR/events.db and DIR/summary.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from voice.audio.clock import VirtualClock, run_on_virtual_clock
from voice.errors import UsageError

RATE = 16000


def run_replay(scenario_path: Path, out: Path, config: dict[str, Any], *, realtime: bool = False,
               stt_model: str | None = None, verbose: bool = False) -> dict[str, Any]:
    clock = VirtualClock()
    if not realtime:
        clock.install()  # before pipecat is imported: its frames capture time.time at import
    try:
        return _run(scenario_path, out, config, realtime, stt_model, clock, verbose)
    finally:
        clock.uninstall()


def _run(scenario_path, out, config, realtime, stt_model, clock, verbose) -> dict[str, Any]:
    import anyio

    from voice.logs import quiet_pipecat

    quiet_pipecat()

    from voice.agent.providers import open_provider
    from voice.agent.providers.scripted import ScriptedProvider
    from voice.runtime import build_runtime, loop_settings
    from voice.audio.replay import ReplayDevice
    from voice.audio.scenario import load_scenario
    from voice.audio.wav import write_wav
    from voice.log.store import EventStore, new_conversation_id
    from voice.speech.models import ModelMissing, load_with_progress
    from voice.speech.session import BargeInSettings, ListenSettings, VadSettings, VoiceSession
    from voice.speech.stt import WhisperEngine
    from voice.speech.tts import PiperEngine

    try:
        scenario = load_scenario(scenario_path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    for name in ("events.db", "events.db-wal", "events.db-shm"):
        (out / name).unlink(missing_ok=True)
    spec = scenario.llm or config["llm"]["provider"]
    provider = (ScriptedProvider(list(scenario.replies), name=scenario.path.name) if scenario.replies is not None
                else anyio.run(open_provider, spec, config))
    if not realtime and not isinstance(provider, ScriptedProvider):
        provider = _OnVirtualClock(provider, clock)
    model = stt_model or scenario.stt_model or config["stt"]["model"]
    try:
        stt = load_with_progress(f"speech recognition (whisper {model})", lambda: WhisperEngine(model, config["stt"]["threads"]))
        tts = load_with_progress("speech synthesis (piper en_US-joe-medium)",
                        lambda: PiperEngine(RATE, alignments=config["tts"]["alignments"]))
    except (ModelMissing, ValueError) as exc:
        raise UsageError(str(exc)) from None
    store = EventStore(out / "events.db")
    session: VoiceSession | None = None
    aec_on = scenario.echo_cancellation if scenario.echo_cancellation is not None else config["audio"]["echo_cancellation"]
    echo = _load_echo() if aec_on else None

    async def announce(text: str) -> None:
        if session is not None:
            await session.surface.notice(text)

    runtime = build_runtime(config, store, announce)
    runtime.env.data_dir = out / "data"  # a replay's notes stay with its outputs
    for t in scenario.tools:
        runtime.tools.add(_scenario_tool(t))
    device = ReplayDevice(scenario, idle=lambda: session is not None and session.idle(), realtime=realtime)
    session = VoiceSession(
        store=store, provider=provider, tools=runtime.tools, settings=loop_settings(config),
        conversation=new_conversation_id(), device=device, stt=stt, tts=tts,
        vad=VadSettings(**config["vad"]), tool_env=runtime.env, timers=runtime.timers, echo=echo,
        barge_in=BargeInSettings(**config["barge_in"]),
        aside=(lambda line: print(line, flush=True)) if verbose else None,
        listen_mode=ListenSettings(mode=scenario.listen_mode, wake_word=config["listen"]["wake_word"],
                                   window_s=scenario.window_s or config["listen"]["window_s"]),
    )
    started = time.perf_counter()
    if realtime:
        anyio.run(session.run)
    else:
        run_on_virtual_clock(session.run(), clock)
    wall = time.perf_counter() - started
    write_wav(out / "mic.wav", device.mic(), RATE)
    write_wav(out / "played.wav", device.played(), RATE)
    summary = _summary(session, device, store, wall)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    if isinstance(provider, ScriptedProvider):  # what the model was really sent, for parity checks
        (out / "requests.json").write_text(json.dumps([list(r.messages) for r in provider.requests], indent=1) + "\n")
    store.close()
    return summary


class _OnVirtualClock:
    """A provider whose waits are network I/O, which the autojump clock does
    not see: hold the clock while its stream runs, so a real model's latency
    is not skipped as idle time."""

    def __init__(self, inner, clock: VirtualClock):
        self.inner, self.clock, self.route = inner, clock, inner.route

    async def stream(self, request):
        with self.clock.busy():
            async for delta in self.inner.stream(request):
                yield delta

    async def aclose(self) -> None:
        await self.inner.aclose()


def _load_echo():
    from voice.audio.echo import EchoCanceller, EchoUnavailable

    try:
        return EchoCanceller()
    except EchoUnavailable as exc:
        raise UsageError(str(exc)) from None


def _scenario_tool(spec):
    import anyio

    from voice.agent.tools import Tool

    async def run(args: dict[str, Any], ctx: Any) -> str:
        await anyio.sleep(spec.wait_s)
        return spec.result

    return Tool(spec.name, f"scenario tool that waits {spec.wait_s} s", {"type": "object"}, spec.effect, run,
                timeout_s=spec.wait_s + 30)


def _summary(session, device, store, wall: float) -> dict[str, Any]:
    from voice.log.projections import turn_reply

    turns = []
    for info in session.turns:
        reply = turn_reply(store, session.conversation, info.turn)
        span = session.speech_span(info.turn)
        barge_in_s = ack_ms = None
        if info.clear_position is not None:
            clips = [p for p in device.placed if p.onset <= info.clear_position]
            if clips:
                onset = max(p.onset for p in clips)
                barge_in_s = onset / RATE
                ack_ms = round((info.clear_position - onset) / RATE * 1000, 1)
        turns.append({
            "turn": info.turn,
            "user_text": reply.user_text,
            "generated_text": reply.generated_text,
            "delivered_text": reply.delivered_text,
            "interrupted": reply.interrupted,
            "status": reply.outcome,
            "barge_in_s": barge_in_s,
            "ack_ms": ack_ms,
            "stop_s": info.clear_position / RATE if info.clear_position is not None else None,
            "speech_start_s": span[0] / RATE if span else None,
            "speech_end_s": span[1] / RATE if span else None,
            "user_start_s": info.utterance_start / RATE,
            "user_end_s": info.utterance_end / RATE,
            "stt_s": round(info.stt_s, 3),
        })
    lateness = sorted(device.tick_lateness) or [0.0]
    duration = device.position / RATE
    return {
        "turns": turns,
        "device": {
            "echo_cancellation": session.echo is not None,
            "duration_s": duration,
            "wall_s": round(wall, 2),
            "speedup": round(duration / wall, 2) if wall else None,
            "tick_lateness_ms_p99": round(lateness[int(0.99 * (len(lateness) - 1))] * 1000, 1),
            "clips": [{"audio": p.clip.name, "start_s": p.start / RATE, "onset_s": p.onset / RATE} for p in device.placed],
            "gave_up": device.gave_up,
        },
    }
