"""A barge-in turn written into a real SQLite log, for the turn picture's
tests: every event the log has today, and (with `proposed=True`) the events
voice/show/load.py proposes, with the payloads its docstring specifies.

The turn, on the device clock (16 kHz mic and speaker):
  0.80 s wake word; speech 0.60-2.40 s, end of turn decided at 3.00 s;
  recognition 400 ms, so the transcript is ready at 3.40 s; first token 3.60 s.
  Step 0 says "Let me note that." (4.00-5.00 s) and calls add_note
  (dispatched 3.90 s, confirmed 4.10 s). Step 1 says three sentences:
  "First, the sea is deep." 5.50-7.00 s; "Second, it is wide." from 7.00 s,
  paused at 7.50 s by a backchannel (onset 7.45 s) and resumed at 8.00 s;
  "Third, it is old." from 8.50 s, paused at 8.80 s by "stop" (onset
  8.70 s: the acknowledgement is 100 ms), confirmed at 9.30 s and cleared
  at 9.32 s. "Fourth, it is blue." was synthesized but never played, and
  "Fifth, it is ours." never synthesized.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voice.log.store import EventStore
from voice.show.timeline import Waveform

RATE = 16000
T0 = 1000.0  # at_mono of the device's first sample
CONVERSATION = "c-show"
TURN = 1

REPLY_0 = "Let me note that."
REPLY_1 = "First, the sea is deep. Second, it is wide. Third, it is old. Fourth, it is blue. Fifth, it is ours."
DELIVERED = "Let me note that. First, the sea is deep. Second, it is wide. Third,"
HEARD = DELIVERED.split()
CUT_WORD = "it"  # "Third, it": playing when the output paused
QUEUED = "is old. Fourth, it is blue.".split()
UNSAID = "Fifth, it is ours.".split()


def s(seconds: float) -> int:
    return int(round(seconds * RATE))


@dataclass
class Written:
    path: Path
    mic: Waveform
    speaker: Waveform
    summary: dict


def _sentence(message_id: str, index: int, text: str, at: int, start_s: float | None, handed: int,
              word_s: float) -> dict:
    """Equal-length words, `word_s` each, from the sentence's first sample."""
    words, char = [], at
    for k, word in enumerate(text.split()):
        words.append([char, char + len(word), s(k * word_s), s((k + 1) * word_s)])
        char += len(word) + 1
    length = s(len(words) * word_s)
    return {"message_id": message_id, "index": index, "char_start": at, "char_end": at + len(text),
            "start": s(start_s) if start_s is not None else None, "length": length, "handed": handed,
            "method": "alignment", "words": words}


def _stream(text: str) -> list:
    """The timed stream of a message: its words 40 ms apart, the first at 150 ms."""
    pieces = text.split(" ")
    return [[150.0 + 40 * k, "text", piece if k == 0 else " " + piece] for k, piece in enumerate(pieces)]


def write_turn(path: Path, *, proposed: bool = True) -> Written:
    """The turn's log at path/events.db (and its audio); `proposed=False`
    writes only what today's log carries."""
    path.mkdir(parents=True, exist_ok=True)
    EventStore(path / "events.db").close()  # the real schema, migrations and triggers
    rows: list[tuple] = []

    def add(type_: str, payload: dict, at_s: float, *, turn: int | None = TURN, step: int | None = None,
            attempt: int | None = None, proposal: bool = False) -> None:
        if proposal and not proposed:
            return
        rows.append((CONVERSATION, turn, step, attempt, type_, json.dumps(payload), T0 + at_s, 1.7e9 + at_s))

    def later(payload: dict, **extra) -> dict:
        return {**payload, **extra} if proposed else payload

    clock = {"speaker_rate": RATE, "output_latency": 0}
    add("audio/clock", {"mic": 0, "speaker": 0, **clock}, 0.0, turn=None, proposal=True)
    add("listen/wake", {"position": s(0.8), "model": "okay_nabu"}, 0.8, turn=None, proposal=True)
    add("listen/speech", {"start": s(0.6), "end": s(2.4), "decided": s(3.0), "for_assistant": True}, 3.0,
        turn=None, proposal=True)
    add("audio/clock", {"mic": s(3.4), "speaker": s(3.4), **clock}, 3.4, turn=None, proposal=True)
    add("turn/start", {"source": "voice"}, 3.4)
    add("user/message", later({"content": "Take a note and tell me about the sea.", "source": "voice"},
                              audio={"start": s(0.6), "end": s(3.0), "stt_ms": 400.0}), 3.4)
    route = {"provider": "scripted", "model": "test", "base_url": None}
    call = {"id": "call_1", "type": "function", "function": {"name": "add_note", "arguments": '{"text": "the sea"}'}}
    add("step/start", {"route": route}, 3.45, step=0, attempt=0)
    add("agent/assistant-stream", {"frame": "start", "route": route}, 3.45, step=0, attempt=0)
    add("assistant/message", {"message_id": "1.0.0", "content": [{"type": "text", "text": REPLY_0}], "route": route,
                              "finish_reason": "tool_calls", "stream": _stream(REPLY_0), "tool_calls": [call]},
        3.8, step=0, attempt=0)
    add("tool/call", {"tool_call_id": "call_1", "name": "add_note", "arguments": '{"text": "the sea"}'},
        3.85, step=0, attempt=0)
    add("tool/dispatch", {"tool_call_id": "call_1", "name": "add_note", "effect": "write",
                          "arguments": {"text": "the sea"}}, 3.9, step=0, attempt=0)
    add("effect/receipt", {"tool_call_id": "call_1", "name": "add_note", "phase": "dispatch", "state": "confirmed",
                           "evidence": {}}, 4.1, step=0, attempt=0)
    add("tool/result", {"tool_call_id": "call_1", "name": "add_note", "status": "ok", "content": "noted",
                        "receipt": "confirmed"}, 4.1, step=0, attempt=0)
    add("step/end", {"outcome": "tool_calls"}, 4.1, step=0, attempt=0)
    add("step/start", {"route": route}, 4.2, step=1, attempt=0)
    add("agent/assistant-stream", {"frame": "start", "route": route}, 4.2, step=1, attempt=0)
    add("assistant/message", {"message_id": "1.1.0", "content": [{"type": "text", "text": REPLY_1}], "route": route,
                              "finish_reason": "stop", "stream": _stream(REPLY_1)}, 5.0, step=1, attempt=0)
    add("step/end", {"outcome": "completed"}, 5.0, step=1, attempt=0)
    add("speech/sentence", _sentence("1.0.0", 0, REPLY_0, 0, 4.0, s(1.0), 0.25), 5.0, step=0, attempt=0,
        proposal=True)
    add("speech/played", {"message_id": "1.0.0", "chars": len(REPLY_0), "words": 4, "samples": s(1.0),
                          "complete": True}, 5.0, step=0, attempt=0)
    # The backchannel: paused and resumed.
    add("speech/paused", later({"onset": s(7.45)}, at=s(7.5)), 7.5)
    add("listen/speech", {"start": s(7.45), "end": s(7.7), "decided": s(8.3), "for_assistant": False}, 8.3,
        turn=None, proposal=True)
    add("speech/resumed", later({"onset": s(7.45), "reason": "heard 'mm-hmm'"}, at=s(8.0)), 8.0)
    # "stop": paused, confirmed, cleared.
    add("speech/paused", later({"onset": s(8.7)}, at=s(8.8)), 8.8)
    add("speech/confirmed", {"onset": s(8.7), "at": s(9.3), "reason": "voiced speech"}, 9.3, proposal=True)
    add("speech/cleared", {"at": s(9.32), "onset": s(8.7)}, 9.32, proposal=True)
    sentences = REPLY_1.split(". ")
    starts = [0]  # character offsets in the message's text
    for text in sentences[:-1]:
        starts.append(starts[-1] + len(text) + 2)
    texts = [t if t.endswith(".") else t + "." for t in sentences]
    add("speech/sentence", _sentence("1.1.0", 0, texts[0], starts[0], 5.5, s(1.5), 0.3), 9.32, step=1,
        attempt=0, proposal=True)
    add("speech/sentence", _sentence("1.1.0", 1, texts[1], starts[1], 7.0, s(1.0), 0.25), 9.32, step=1,
        attempt=0, proposal=True)
    add("speech/sentence", _sentence("1.1.0", 2, texts[2], starts[2], 8.5, s(0.3), 0.25), 9.32, step=1,
        attempt=0, proposal=True)
    add("speech/sentence", _sentence("1.1.0", 3, texts[3], starts[3], None, 0, 0.25), 9.32, step=1,
        attempt=0, proposal=True)
    delivered_1 = DELIVERED[len(REPLY_0) + 1:]
    add("speech/played", {"message_id": "1.1.0", "chars": len(delivered_1), "words": len(delivered_1.split()),
                          "samples": s(2.8), "complete": False}, 9.33, step=1, attempt=0)
    add("turn/end", {"outcome": "aborted"}, 9.34)
    add("listen/speech", {"start": s(8.7), "end": s(9.6), "decided": s(10.2), "for_assistant": True}, 10.2,
        turn=None, proposal=True)
    with sqlite3.connect(path / "events.db") as db:
        db.executemany("INSERT INTO events(conversation, turn, step, attempt, type, payload, at_mono, at_wall)"
                       " VALUES (?,?,?,?,?,?,?,?)", rows)
    db.close()
    mic, speaker = _audio()
    # What `voice replay` writes to summary.json for this turn.
    summary = {"turn": TURN, "user_start_s": 0.6, "user_end_s": 3.0, "stt_s": 0.4, "speech_start_s": 4.0,
               "speech_end_s": 8.8, "stop_s": 8.8, "delivered_text": DELIVERED}
    return Written(path, mic, speaker, summary)


def _audio(seconds: float = 12.0) -> tuple[Waveform, Waveform]:
    """Noise where the person speaks, a tone where the speaker plays."""
    rng = np.random.default_rng(18)
    t = np.arange(s(seconds)) / RATE
    mic = rng.normal(0, 30, len(t))
    for start, end in ((0.6, 2.4), (7.45, 7.7), (8.7, 9.6)):
        span = (t >= start) & (t < end)
        mic[span] += rng.normal(0, 6000, span.sum()) * np.abs(np.sin(2 * np.pi * 3 * t[span]))
    speaker = np.zeros(len(t))
    for start, end in ((4.0, 5.0), (5.5, 7.5), (8.0, 8.8)):
        span = (t >= start) & (t < end)
        speaker[span] = 9000 * np.sin(2 * np.pi * 220 * t[span]) * np.abs(np.sin(2 * np.pi * 2 * t[span]))
    return (Waveform(np.clip(mic, -32768, 32767).astype(np.int16), RATE),
            Waveform(speaker.astype(np.int16), RATE))


def write_replay_dir(path: Path, *, proposed: bool = True) -> Written:
    """The turn as a `voice replay --out` directory: events.db, mic.wav,
    played.wav, summary.json."""
    from voice.audio.wav import write_wav

    written = write_turn(path, proposed=proposed)
    write_wav(path / "mic.wav", written.mic.samples, RATE)
    write_wav(path / "played.wav", written.speaker.samples, RATE)
    (path / "summary.json").write_text(json.dumps({"turns": [written.summary]}))
    return written
