"""`voice replay SCENARIO --out DIR`: a scenario through the same pipeline the
live service runs, with the replay device on the autojump clock.

Writes DIR/mic.wav and DIR/played.wav (same 16 kHz sample clock) as it
goes, through the recorder `voice run --record` uses (a killed replay leaves
them readable, up to the block it was at), DIR/events.db, and at the end
DIR/summary.json, and DIR/requests.json (what the scripted model was sent,
whole JSON after each request: voice.service.requests_file).
DIR must be new or empty: a replay never writes over a log or a recording.
The device keeps no sound and the provider no requests: memory stays flat over
length in time (benchmarks/replay_memory.py).
"""

from __future__ import annotations

import errno
import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from voice.audio.clock import VirtualClock, run_on_virtual_clock
from voice.audio.device import MIC_RATE
from voice.errors import Failed, UsageError, as_usage_error
from voice.settings import Settings



#: Voice-surface units (messages) a replay holds, the newest, as a service
#: does: the summary's speech spans are folded in as they play (SpeechSpans).
KEEP_UNITS = 256


def run_replay(scenario_path: Path, out: Path, settings: Settings, *, realtime: bool = False,
               stt_model: str | None = None, verbose: bool = False) -> dict[str, Any]:
    clock = VirtualClock()
    if not realtime:
        clock.install()  # before pipecat is imported: its frames capture time.time at import
    try:
        return _run(scenario_path, out, settings, realtime, stt_model, clock, verbose)
    except (OSError, sqlite3.OperationalError, BaseExceptionGroup) as exc:
        if not _disk_full(exc):
            raise
        raise Failed(f"the disk under {out} is full: free some space and replay again (what was written "
                     f"before it filled is in {out})") from None
    finally:
        clock.uninstall()


def _disk_full(exc: BaseException) -> bool:
    """Whether this error (or one of a task group's) is a full disk or quota."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_disk_full(e) for e in exc.exceptions)
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(exc, sqlite3.OperationalError) and "full" in str(exc)


def _run(scenario_path, out, settings: Settings, realtime, stt_model, clock, verbose) -> dict[str, Any]:
    import anyio

    from voice.logs import quiet_pipecat

    quiet_pipecat()

    from voice.agent.providers.scripted import ScriptedProvider
    from voice.audio.recording import Recorder, private_directory
    from voice.service.assembly import AppState, Keeping, SpeechModelChoice, VoiceOptions, open_voice
    from voice.service.requests_file import RequestsFile
    from voice.service.scenario import load_scenario

    with as_usage_error(ValueError):
        scenario = load_scenario(scenario_path)
    clock.free_compute = scenario.timing == "recorded" and not realtime
    try:  # never over what is there: a state folder's log, a recording replayed into its own folder
        private_directory(out)
    except (ValueError, OSError) as exc:
        raise UsageError(f"--out: {_reason(exc)}") from None
    device = replay_device(scenario, realtime=realtime)
    spans = SpeechSpans(device.buffer)
    tools = [_scenario_tool([t for t in scenario.tools if t.name == name])
             for name in dict.fromkeys(t.name for t in scenario.tools)]

    async def main() -> tuple[dict[str, Any], ScriptedProvider | None]:
        recorder = Recorder(directory=out, block_sizes=False)  # the mic and the speaker, to disk as they come
        try:
            return await replay(recorder)
        finally:  # stopped early (Ctrl-C) too: the sound so far stays with the log so far
            recorder.close()

    async def replay(recorder: Recorder) -> tuple[dict[str, Any], ScriptedProvider | None]:
        # A replay's notes stay with its outputs; its log is fresh, so there is nothing to recover; recorded
        # results stand in for every tool: no MCP server starts. A real server's answer is network I/O:
        # the clock holds while it runs (`hold`).
        options = VoiceOptions(
            scenario=scenario, llm=scenario.llm, resume=False, tools=tuple(tools), hold=clock.busy,
            models=SpeechModelChoice(stt_model=stt_model or scenario.stt_model, echo=scenario.echo_cancellation,
                                     echo_required=True, before_log=True),
            keeping=Keeping(recorder=recorder, verbose=verbose,
                            keep=None, keep_units=KEEP_UNITS),  # finite: its summary reads every turn's figures
            state=AppState(db=out / "events.db", data_dir=out / "data", grants=out / "grants.json",
                           recovery=False, mcp=False))
        async with open_voice(settings, device, options) as voice:
            started = time.perf_counter()
            gate = voice.session.parts.listen.addressing.gate
            if gate is not None:  # the listen gate as the recorded session had it when its recording began
                if scenario.wake_word_at is not None:
                    gate.on_wake(scenario.wake_word_at)
                if scenario.assistant_stopped_at is not None:
                    gate.on_assistant_stopped(scenario.assistant_stopped_at)
            # The scenario's scripted replies (a server's provider, held on the clock, is not one)
            scripted = voice.app.provider if isinstance(voice.app.provider, ScriptedProvider) else None
            if scripted is None:
                await run_typing(voice.session, device, scenario.says, scenario.controls)
            else:  # what the model was really sent, for parity checks: to disk as it is asked
                with closing(RequestsFile(out / "requests.json")) as requests:
                    for request in scripted.requests:  # (none yet: the session has not run)
                        requests.add(request)
                    scripted.requests.clear()
                    scripted.on_request = requests.add
                    await run_typing(voice.session, device, scenario.says, scenario.controls)
            summary = _summary(voice.session, device, spans, voice.app.store, time.perf_counter() - started)
            return summary, scripted

    summary, scripted = anyio.run(main) if realtime else run_on_virtual_clock(main(), clock)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    if scenario.timing == "recorded" and scripted is not None and scripted.asked > len(scripted.replies):
        # The replay heard a request the recording has no reply for (it went on: that turn failed).
        raise Failed(f"no recorded reply for model request {len(scripted.replies) + 1} (the scenario has "
                     f"{len(scripted.replies)}): the replay asked the model more than the session did; what it "
                     f"did is in {out}")
    return summary


async def run_typing(session, device, says, controls=()) -> None:
    """The session, with each [[say]] typed at its second on the device's
    clock, as `voice ctl say` types it: into the same queue as the spoken
    turns, answered by voice; and each [[control]] given through the same
    session calls the control socket makes, once the listener has heard the
    mic up to its second (a mute there mutes the blocks after it, as live)."""
    import anyio

    typed = []  # the [[say]] tables typed so far

    async def type_at(say) -> None:
        while (due := say.at_s - device.position / MIC_RATE) > 0:
            await anyio.sleep(due)
        typed.append(say)
        try:
            await session.say(say.text)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise Failed(f"the replay ended before the typed turn at {say.at_s:g} s ({say.text!r}) ran") from None

    async def give(controls) -> None:  # one task, in order: a mute and its unmute never swap
        listen = session.parts.listen
        for control in controls:
            position = round(control.at_s * MIC_RATE)
            while (ahead := position - listen.position) > 0:
                # In steps shorter than a block near it: the clock stands still while the
                # listener works, so this wakes after the block that reaches it, before the next.
                await anyio.sleep(max(CONTROL_STEP_S, ahead / MIC_RATE - 0.1))
            typed.append(control)
            try:
                await _control(session, control.command)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                raise Failed(f"the replay ended before the [[control]] at {control.at_s:g} s "
                             f"({control.command}) was given") from None

    async with anyio.create_task_group() as tg:
        for say in says:
            tg.start_soon(type_at, say)
        tg.start_soon(give, controls)
        await session.run()
        tg.cancel_scope.cancel()
    if late := [say for say in says if say not in typed]:
        raise Failed(f"[[say]] at {late[0].at_s:g} s ({late[0].text!r}) comes after the replay ended at "
                     f"{device.position / MIC_RATE:.1f} s: type it while the scenario's sound plays")
    if late := [control for control in controls if control not in typed]:
        raise Failed(f"[[control]] at {late[0].at_s:g} s ({late[0].command}) comes after the replay ended at "
                     f"{device.position / MIC_RATE:.1f} s: give it while the scenario's sound plays")


CONTROL_STEP_S = 0.001  # shorter than any mic block (10 ms and up)


async def _control(session, command: str) -> None:
    """`voice ctl COMMAND` of a [[control]], as the control server calls it."""
    if command in ("mute", "unmute"):
        session.mute(command == "mute")
    elif command == "cancel":
        await session.cancel()
    else:
        await session.new_conversation()


def replay_device(scenario, *, realtime: bool = False):
    """The device of `voice replay`: it keeps what the summary reads (every
    clip placed, tick lateness as counts), not the sound, which the session's
    recorder writes to disk as it comes; so a long replay runs in flat memory."""
    from voice.audio.replay_device import ReplayDevice
    from voice.service.assembly import not_yet_idle

    return ReplayDevice(scenario, idle=not_yet_idle, realtime=realtime, record=False, summarize=True)


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return f"cannot create {exc.filename or 'the folder'}: {exc.strerror or exc}"
    return str(exc)


def _scenario_tool(specs):
    """One tool from the scenario's [[tool]] tables of one name: each call
    gets the next one's answer (the last one repeats)."""
    import anyio

    from voice.agent.tools.base import Receipt, Tool, ToolOutcome

    calls = []

    async def run(args: dict[str, Any], ctx: Any) -> Any:
        spec = specs[min(len(calls), len(specs) - 1)]
        calls.append(args)
        await anyio.sleep(spec.wait_s)
        if spec.effect != "write" or spec.receipt is None:
            return spec.result
        return ToolOutcome(spec.result, Receipt(spec.receipt, {"stand_in": "scenario"}), spec.phrase)

    first = specs[0]
    return Tool(first.name, f"scenario tool that waits {first.wait_s} s", {"type": "object"}, first.effect, run,
                timeout_s=max(s.wait_s for s in specs) + 30, ask_first=first.ask_first,
                destructive=first.ask_first)


class SpeechSpans:
    """Device positions of the first and last played sample of each turn's
    speech, folded in as the playback buffer hands samples over (its
    `on_handed`): one pair a turn, while the buffer forgets the sentences."""

    def __init__(self, buffer) -> None:
        self._spans: dict[tuple[str, int], tuple[int, int]] = {}
        buffer.on_handed = self._handed

    def _handed(self, key, start: int, end: int) -> None:
        ref = key[0]  # a sentence's key: (its unit, its index)
        turn = (ref.conversation, ref.turn)
        known = self._spans.get(turn)
        self._spans[turn] = (start, end) if known is None else (min(known[0], start), max(known[1], end))

    def of(self, conversation: str, turn: int) -> tuple[int, int] | None:
        return self._spans.get((conversation, turn))


def _summary(session, device, spans: SpeechSpans, store, wall: float) -> dict[str, Any]:
    from voice.log.projections import turn_reply

    turns = []
    for info in session.turns:
        reply = turn_reply(store, info.conversation, info.turn)
        span = spans.of(info.conversation, info.turn)
        barge_in_s = ack_ms = measured_from = None
        if info.clear_position is not None:
            clips = [p for p in device.placed if p.onset <= info.clear_position]
            if len(device.scenario.users) == 1 and info.barge_in_onset is not None:
                clips = []  # one track holds all the speech (a recording): the VAD's onset is the one known
                onset = info.barge_in_onset
                barge_in_s = onset / MIC_RATE
                ack_ms = round((info.clear_position - onset) / MIC_RATE * 1000, 1)
                measured_from = "vad"
            if clips:
                onset = max(p.onset for p in clips)
                barge_in_s = onset / MIC_RATE
                ack_ms = round((info.clear_position - onset) / MIC_RATE * 1000, 1)
                measured_from = "clip"
        turns.append({
            "conversation": info.conversation,
            "turn": info.turn,
            "user_text": reply.user_text,
            "generated_text": reply.generated_text,
            "delivered_text": reply.delivered_text,
            "interrupted": reply.interrupted,
            "status": reply.outcome,
            "barge_in_s": barge_in_s,
            "ack_ms": ack_ms,  # the output cleared, this long after the barge-in began:
            "ack_from": measured_from,  # "clip": its clip's first loud sample; "vad": the VAD's onset
            "stop_s": info.clear_position / MIC_RATE if info.clear_position is not None else None,
            "speech_start_s": span[0] / MIC_RATE if span else None,
            "speech_end_s": span[1] / MIC_RATE if span else None,
            "user_start_s": info.utterance_start / MIC_RATE,
            "user_end_s": info.utterance_end / MIC_RATE,
            "stt_s": round(info.stt_s, 3),
        })
    duration = device.position / MIC_RATE
    listen = session.parts.listen
    tracker = listen.turn_end
    early_speech = session.parts.turns.early_speech
    return {
        "turns": turns,
        # mic blocks, and how many of them the VAD and the wake-word model ran on (they rest on silence)
        "listener": {"blocks": listen.blocks, "vad_runs": listen.activity.runs,
                     "wake_runs": listen.addressing.runs},
        # speculative recognitions, and model requests started before their turn (voice.agent.preempt)
        # and their first sentences synthesized before the commit, those a turn played and the compute time of
        # those it did not (voice.speech.early_speech)
        "turn_end": {"speculations": tracker.speculations, "used": tracker.used,
                     "early_starts": session.parts.turns.early_starts, "early_used": session.parts.turns.early_used,
                     "early_sentences": early_speech.synthesized, "early_sentences_used": early_speech.used,
                     "early_sentences_dropped_s": round(early_speech.dropped_s, 3)},
        "device": {
            "echo_cancellation": session.echo is not None,
            "timing": device.scenario.timing,  # "recorded": inference took no time on this clock
            "duration_s": duration,
            "wall_s": round(wall, 2),
            "speedup": round(duration / wall, 2) if wall else None,
            "tick_lateness_ms_p99": device.lateness_p99_ms(),
            "clips": [{"audio": p.clip.name, "start_s": p.start / MIC_RATE, "onset_s": p.onset / MIC_RATE} for p in device.placed],
            "gave_up": device.gave_up,
            "losses_not_reached": device.losses_not_reached,
        },
    }
