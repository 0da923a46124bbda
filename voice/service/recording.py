"""A saved session: what `voice run --record DIR` keeps and `voice ctl save
DIR` writes from the in-memory ring, in one directory (0700, files 0600):

    mic.wav, played.wav   the microphone before echo cancellation and what the
                          speaker played, 16 kHz (voice.audio.recording)
    mic_blocks.txt        the size of each mic block the device delivered
    recording.json        where each track starts on the device clock
    events.db             this session's events, of every conversation it held (a copy)
    scenario.toml         `voice replay DIR/scenario.toml --out OUT` runs it again
    config.toml           the settings that decide the outcome (replay reads it)

The scenario is the recorded microphone as one continuous [[user]] track
from t = 0, with no echo path of its own (the recording holds the real one),
the model's recorded replies as the scripted provider (each request's text,
reasoning and tool calls from the log's timed stream, due when its first
delta came on the recording's clock, the rest at the mean gap between
deltas), each sentence of a reply held until where it began playing
(speech synthesis takes its own time on each machine, and a loaded one
leaves gaps between sentences: without the hold, a barge-in at the same
second cuts other words), and a stand-in for every
tool that was called, answering with the recorded result and receipt: a
replay never acts on the world.

Requests that were typed (`voice ctl say`) are `[[say]]` tables, typed
again at the second their turn began; each `voice ctl mute`, `unmute`,
`cancel` and `new` (its `listen/control` row) a `[[control]]` at the mic
position it came, so a request spoken while muted is not heard again; each time the sound card
went (`audio/lost`) an `[[audio_lost]]` where the mic had got to, for as long as it was away; turns that began before the ring
did (an utterance, or typing, before its start) are left out.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from voice.audio.device import MIC_RATE
from voice.audio.listening import ListenGate
from voice.audio.recording import BLOCKS, Recorder, private_file
from voice.log import events as ev
from voice.log.events import Event
from voice.log.store import EventStore
from voice.settings import Settings

# The settings that decide what a replay does with the same sound: when
# speech starts and a turn ends, what is recognised, how a barge-in is
# judged, when a conversation starts over, and what the model is sent and
# may do (the devices, the model server, paths and commands are the
# machine's own). A section named whole keeps the keys it gains later.
REPLAYED_SETTINGS = ("vad", "turn_end", "stt", "tts", "barge_in", "listen", "conversation", "llm.max_steps",
                     "llm.context_tokens", "llm.reply_tokens", "llm.system_prompt", "audio.echo_cancellation",
                     "tools.approval_timeout_s")
TAIL_S = 3.0  # silence kept after the recording, for the last reply to settle


def save_session(directory: Path, recorder: Recorder, store: EventStore, settings: Settings,
                 *, since_seq: int) -> dict[str, Any]:
    """Write the recording, the session's events (those after `since_seq`,
    of every conversation it held: `voice ctl new`, "start over" and the
    idle gap switch conversations mid-session, and the sound spans them
    all), the scenario and the config into `directory`; returns what was
    saved, with the spoken turns left out because they began before the
    recording did (`before_start`: a ring shorter than the turn)."""
    info = recorder.save(directory)
    events = store.events(after_seq=since_seq)
    _copy_events(directory / "events.db", events)
    mic_start = info["mic_start"]
    duration_s = _wav_seconds(directory / "mic.wav")
    spoken = _voice_turns(events)
    all_typed = _typed_turns(events, mic_start / MIC_RATE)
    typed = [t for t in all_typed if t[2] >= 0]
    kept = {turn for turn, start in spoken if start >= mic_start} | {turn for turn, _, _ in typed}
    turns = [turn for turn in dict.fromkeys(e.turn for e in events) if turn in kept]  # in the order they came
    ordinal = {turn: n for n, turn in enumerate(turns, 1)}  # a replay numbers its turns from 1
    replies, tools = _replies(events, ordinal, mic_start / MIC_RATE), _tools(events, kept)
    plays = _plays(events, ordinal, mic_start / MIC_RATE)
    controls = _controls(events, mic_start)
    _write(directory / "scenario.toml", _scenario_toml(duration_s, replies, tools, plays, settings,
                                                       [(text, at_s) for _, text, at_s in typed], controls,
                                                       _losses(events, mic_start),
                                                       blocks=(directory / BLOCKS).is_file(),
                                                       gate=_gate_at_start(events, mic_start, settings)))
    _write(directory / "config.toml", config_toml(settings))
    return {"directory": str(directory), "seconds": round(duration_s, 2), "turns": turns,
            "before_start": [t for t, start in spoken if start < mic_start] + [t for t, _, at_s in all_typed if at_s < 0],
            "mic_start": mic_start}


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    private_file(path)


def _wav_seconds(path: Path) -> float:
    import wave

    with wave.open(str(path), "rb") as w:
        return w.getnframes() / w.getframerate()


def _copy_events(path: Path, events: list[Event]) -> None:
    EventStore(path).close()  # the real schema and its checks
    with sqlite3.connect(path) as db:
        db.executemany("INSERT INTO events(conversation, turn, step, attempt, type, payload, at_mono, at_wall)"
                       " VALUES (?,?,?,?,?,?,?,?)",
                       [(e.conversation, e.turn, e.step, e.attempt, e.type, ev.encode_payload(e.payload), e.at_mono,
                         e.at_wall) for e in events])
    db.close()
    for name in (path.name, path.name + "-wal", path.name + "-shm"):
        if (path.parent / name).exists():
            private_file(path.parent / name)


def _voice_turns(events: list[Event]) -> list[tuple[int, int]]:
    """(turn, mic position of its utterance) of each spoken request."""
    out = []
    for e in events:
        if e.type == ev.USER_MESSAGE and e.turn is not None:
            audio = e.body.audio
            if e.body.source == "voice" and audio is not None:
                out.append((e.turn, int(audio["start"])))
    return out


def _typed_turns(events: list[Event], track_start_s: float) -> list[tuple[int, str, float]]:
    """(turn, text, second on the track) of each typed request (`voice ctl
    say`): when its turn began, on the recording's clock."""
    clocks: list[Event] = []
    out = []
    for e in events:
        if e.type == ev.AUDIO_CLOCK:
            clocks.append(e)
        elif e.type == ev.USER_MESSAGE and e.turn is not None and e.body.source == "text" and clocks:
            out.append((e.turn, e.body.content, round(_on_track(clocks[-1], e.at_mono, track_start_s), 3)))
    return out


def _controls(events: list[Event], mic_start: int) -> list[tuple[str, float]]:
    """(command, second on the track) of each control (`listen/control`) in
    the recording; muted when it began: a mute at 0 (the others before it are done)."""
    rows = [e.body for e in events if e.type == ev.LISTEN_CONTROL]
    muted = [c.command for c in rows if c.position < mic_start and c.command in ("mute", "unmute")]
    first = [("mute", 0.0)] if muted and muted[-1] == "mute" else []
    return first + [(c.command, round((c.position - mic_start) / MIC_RATE, 4)) for c in rows if c.position >= mic_start]


def _losses(events: list[Event], mic_start: int) -> list[tuple[float, float]]:
    """(second on the track, seconds away) of each time the sound card went
    (`audio/lost` with its mic position) in the recording: the mic stood
    still meanwhile, as a replay's [[audio_lost]] makes it. One the session
    ended in lasts until its last event."""
    out = []
    for n, e in enumerate(events):
        if e.type != ev.AUDIO_LOST or e.body.mic is None or e.body.mic < mic_start:
            continue
        back = next((b for b in events[n + 1:] if b.type == ev.AUDIO_BACK), None)
        away = back.body.after_s if back is not None else events[-1].at_mono - e.at_mono
        out.append((round((e.body.mic - mic_start) / MIC_RATE, 4), round(max(away, 0.0), 3)))
    return out


def _gate_at_start(events: list[Event], mic_start: int, settings: Settings) -> dict[str, float]:
    """The listen gate's state where the recording begins, in seconds before it
    (wake mode): a wake word heard and not yet used by an utterance for the
    assistant, and where the assistant last stopped speaking while its
    conversation window is still open there. A ring that begins mid-session
    replays with them, or a follow-up the session answered would need a wake word."""
    if settings.listen.mode != "wake" or mic_start == 0:
        return {}
    gate = ListenGate(settings.listen.mode, settings.listen.window_s)
    before = lambda position: (position - mic_start) / MIC_RATE  # noqa: E731
    state = {}
    wakes = [e.body.position for e in events if e.type == ev.LISTEN_WAKE and e.body.position < mic_start]
    if wakes and -before(wakes[-1]) <= gate.wake_valid_s:
        used = any(e.type == ev.LISTEN_SPEECH and e.body.for_assistant
                   and wakes[-1] <= (e.body.decided or e.body.end) < mic_start for e in events)
        if not used:
            state["wake_word_at"] = round(before(wakes[-1]), 4)
    stops = [e.body.position for e in events if e.type == ev.LISTEN_WINDOW and e.body.position < mic_start]
    if stops and -before(stops[-1]) <= gate.window_s:
        state["assistant_stopped_at"] = round(before(stops[-1]), 4)
    return state


def _on_track(anchor: Event, at_mono: float, track_start_s: float) -> float:
    """The second on the recording's track of a moment of the log's clock
    (`anchor`: the latest audio/clock before it)."""
    return anchor.body.mic / MIC_RATE + at_mono - anchor.at_mono - track_start_s


# -- the model's replies --------------------------------------------------------


def _replies(events: list[Event], ordinal: dict[int, int], track_start_s: float) -> list[dict[str, Any]]:
    """One scripted reply per model request of those turns (`ordinal`: the
    turn's number in the replay), in order, each with its request's id as
    the replay numbers it and due (`at_s`) when its first delta came, on
    the recording's clock."""
    seen: set[tuple] = set()
    started: dict[tuple, float] = {}
    clocks: list[Event] = []
    replies = []
    for e in events:
        key = (e.turn, e.step, e.attempt)
        if e.type == ev.AUDIO_CLOCK:
            clocks.append(e)
        elif e.type == ev.ASSISTANT_STREAM and e.body.frame == "start":
            started[key] = e.at_mono
        if e.turn not in ordinal or e.type not in (ev.ASSISTANT_MESSAGE, ev.ASSISTANT_ATTEMPT):
            continue
        body: ev.AssistantMessage | ev.AssistantAttempt = e.body
        stream = body.stream
        if stream is None or key in seen:  # our own phrases (receipts) have no stream: not the model's
            continue
        seen.add(key)
        reply = {"message": f"{ordinal[e.turn]}.{e.step}.{e.attempt}", **_reply(stream)}
        calls = body.tool_calls if isinstance(body, ev.AssistantMessage) else None
        if calls:  # the calls as the message recorded them (complete; a cut stream has none)
            reply["tool_calls"] = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                   for c in calls]
        if key in started and clocks:  # the device clock of that moment: the latest anchor before it
            first = started[key] + reply["first_delay_ms"] / 1000
            reply["at_s"] = round(_on_track(clocks[-1], first, track_start_s), 3)
            reply["first_delay_ms"] = 0.0
        replies.append(reply)
    return replies


def _reply(stream: list[list[Any]]) -> dict[str, Any]:
    text, after, reasoning = [], [], []
    calls: dict[int, dict[str, str]] = {}
    finish = None
    offsets = []
    for offset, kind, data in stream:
        if kind == "finish":
            finish = data
            continue
        offsets.append(float(offset))
        if kind == "text":
            (after if calls else text).append(data)
        elif kind == "reasoning":
            reasoning.append(data)
        elif kind == "tool_call":
            call = calls.setdefault(int(data.get("index") or 0), {"name": "", "arguments": ""})
            call["name"] = call["name"] or (data.get("name") or "")
            call["arguments"] += data.get("arguments") or ""
    reply: dict[str, Any] = {"text": "".join(text)}
    if reasoning:
        reply["reasoning"] = "".join(reasoning)
    if after:
        reply["text_after_tools"] = "".join(after)
    reply["first_delay_ms"] = round(offsets[0], 1) if offsets else 0.0
    gaps = len(offsets) - 1
    reply["chunk_delay_ms"] = round((offsets[-1] - offsets[0]) / gaps, 1) if gaps > 0 else 0.0
    if finish is not None:
        reply["finish"] = finish
    reply["tool_calls"] = [{"name": c["name"], "arguments": c["arguments"] or "{}"} for _, c in sorted(calls.items())]
    return reply


def _plays(events: list[Event], ordinal: dict[int, int], track_start_s: float) -> list[tuple[str, int, float]]:
    """(message id as the replay will number it, sentence, second on the
    track) where each sentence began playing."""
    rate = next((e.body.speaker_rate for e in reversed(events) if e.type == ev.AUDIO_CLOCK), MIC_RATE)
    plays = []
    for e in events:
        if e.type == ev.SPEECH_SENTENCE and e.turn in ordinal and e.body.start is not None:
            sentence: ev.SpeechSentence = e.body
            _, rest = sentence.message_id.split(".", 1)
            plays.append((f"{ordinal[e.turn]}.{rest}", sentence.index, round(sentence.start / rate - track_start_s, 4)))
    return plays


# -- tools ----------------------------------------------------------------------


def _tools(events: list[Event], turns: set[int]) -> list[dict[str, Any]]:
    """A stand-in per tool call, in call order: its recorded result,
    receipt and phrase, and how long it took."""
    calls: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.turn not in turns or e.type not in (ev.TOOL_DISPATCH, ev.TOOL_RESULT, ev.EFFECT_RECEIPT,
                                                  ev.APPROVAL_REQUESTED, ev.APPROVAL_ANSWERED):
            continue
        b = e.body
        if isinstance(b, (ev.ApprovalRequested, ev.ApprovalAnswered)):
            # Asked first in the session: asked in the replay too (a remembered grant asked nothing).
            call = calls.setdefault(b.approval_id, {"name": b.tool if isinstance(b, ev.ApprovalRequested) else ""})
            call["asked"] = call.get("asked", True) and not (isinstance(b, ev.ApprovalAnswered) and b.how == "always")
            continue
        call = calls.setdefault(b.tool_call_id, {"name": b.name})
        if isinstance(b, ev.ToolDispatched):
            call["effect"], call["dispatched"] = b.effect or "read", e.at_mono
        elif isinstance(b, ev.EffectReceipt) and b.phase == "dispatch":
            call["receipt"] = b.state
        elif isinstance(b, ev.ToolResult) and "dispatched" in call:
            # what the model saw: its content, else its error, as written (a null included)
            content = b.content if b.given("content") else b.error if b.given("error") else ""
            call["result"] = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            call["wait_s"] = round(max(0.0, e.at_mono - call["dispatched"]), 3)
            if b.phrase:
                call["phrase"] = b.phrase
    out = []
    for call in calls.values():
        if "result" not in call and not call.get("asked"):
            continue  # never dispatched: the replay will not dispatch it either
        if "result" not in call:  # asked and not dispatched: the replay asks too
            call.update(wait_s=0.0, result="", effect="write")
        tool = {"name": call["name"], "wait_s": call["wait_s"], "result": call["result"], "effect": call["effect"]}
        if call["effect"] == "write":
            tool["receipt"] = call.get("receipt", ev.UNKNOWN)
        if "phrase" in call:
            tool["phrase"] = call["phrase"]
        if call.get("asked"):
            tool["ask_first"] = True
        out.append(tool)
    return out


# -- TOML -------------------------------------------------------------------------


def _value(v: Any) -> str:
    """A TOML value for the plain values written here (JSON's string escapes are TOML's)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"no TOML for {v!r}")


def _scenario_toml(duration_s: float, replies: list[dict[str, Any]], tools: list[dict[str, Any]],
                   plays: list[tuple[str, int, float]], settings: Settings,
                   says: list[tuple[str, float]], controls: list[tuple[str, float]],
                   losses: list[tuple[float, float]], *, blocks: bool,
                   gate: dict[str, float]) -> str:
    lines = [
        "# A recorded session (voice run --record / voice ctl save): replay it with",
        "#   voice replay scenario.toml --out OUT      (it reads config.toml beside it)",
        "# The microphone as captured, from the device's start, as one track; no [echo]:",
        "# the recording holds the room's own.",
        "timing = \"recorded\"   # inference takes no time: the recording's times below stand for it",
        f"tail = {TAIL_S}",
        f"max_duration = {round(duration_s + 60.0, 1)}",
        f"stt_model = {_value(settings.stt.model)}",
        "",
        "[listen]",
        f"mode = {_value(settings.listen.mode)}",
        f"window_s = {_value(float(settings.listen.window_s))}",
        f"echo_cancellation = {_value(settings.audio.echo_cancellation)}",
        # the wake word not yet used, the assistant's last stop (its conversation window), before the start
        *(f"{key} = {_value(at)}" for key, at in gate.items()),
        "",
        "[[user]]",
        'audio = "mic.wav"',
        "at = 0.0",
    ]
    if blocks:  # the VAD decides per block: the replay cuts the sound as the device did
        lines.insert(lines.index("[listen]") - 1, f"mic_blocks = {_value(BLOCKS)}")
    for reply in replies:
        lines += ["", "[[reply]]"]
        for key in ("message", "text", "reasoning", "text_after_tools", "at_s", "first_delay_ms", "chunk_delay_ms",
                    "finish"):
            if key in reply:
                lines.append(f"{key} = {_value(reply[key])}")
        for call in reply["tool_calls"]:
            lines += ["[[reply.tool_calls]]", f"name = {_value(call['name'])}",
                      f"arguments = {_value(call['arguments'])}  # as streamed (JSON)"]
    if says:
        lines += ["", "# What was typed (voice ctl say), when its turn began: the replay types it then."]
    for text, at_s in says:
        lines += ["[[say]]", f"text = {_value(text)}", f"at = {_value(at_s)}"]
    if controls:
        lines += ["", "# voice ctl mute / unmute / cancel / new, where the mic had got to: the replay gives each there."]
    for command, at_s in controls:
        lines += ["[[control]]", f"command = {_value(command)}", f"at = {_value(at_s)}"]
    if losses:
        lines += ["", "# The sound card went (audio/lost) where the mic had got to, and came back after: the replay loses it there."]
    for at_s, away_s in losses:
        lines += ["[[audio_lost]]", f"at = {_value(at_s)}", f"back_after = {_value(away_s)}"]
    for tool in tools:
        lines += ["", "[[tool]]"] + [f"{k} = {_value(v)}" for k, v in tool.items()]
    if plays:
        lines += ["", "# Where each sentence of a reply began playing: the replay holds it until then."]
    for message, sentence, at_s in plays:
        lines += ["[[play]]", f"message = {_value(message)}", f"sentence = {sentence}", f"at_s = {_value(at_s)}"]
    return "\n".join(lines) + "\n"


def config_toml(settings: Settings) -> str:
    """The settings of REPLAYED_SETTINGS as a config file."""
    tables: dict[str, dict[str, Any]] = {}
    for name in REPLAYED_SETTINGS:
        section, _, key = name.partition(".")
        table = settings.table(section)
        values = {key: table[key]} if key else table
        tables.setdefault(section, {}).update({k: v for k, v in values.items() if not isinstance(v, dict)})
    lines = ["# The settings this session ran with that decide a replay's outcome (see voice/service/recording.py)."]
    for section, values in tables.items():
        lines += ["", f"[{section}]"] + [f"{k} = {_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"
