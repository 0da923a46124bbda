"""Where each millisecond of voice to voice goes (#38.5), read from what a
`voice replay` logged: per turn, from the end of the person's speech, when

- `words`: the early start's speculative words were known (`assistant/message` early.words_ms),
- `request`: its request went out (early.sent_ms),
- `first_token`: the model's first text came (early.first_text_ms; without an early start, the stream's first text),
- `first_sentence`: the first sentence was handed to synthesis (`speech/sentence` 0 `asked`),
- `audio_ready`: its audio was synthesized (`ready`),
- `commit`: the turn was committed (its `audio/clock`, written as it starts, just before `turn/start`),
- `played`: the reply's first sample played (summary.json `speech_start_s`, the v2v's end),

each in ms after the end of speech (the clip's last loud sample, as `v2v_ms`
counts it). Log times (`at_mono`) are placed on the device's sample clock by
the `audio/clock` written before the turn. `overlap_ms`: how much of the
work from the request to the audio ready ran before the commit, under the
end-of-turn wait.
"""

from __future__ import annotations

from typing import Any

from common import stats
from replays import v2v_breakdown

STAGES = ("words", "request", "first_token", "first_sentence", "audio_ready", "commit", "played")
CHAIN = ("words", "request", "first_token", "first_sentence", "audio_ready", "played")  # each after the one before
MIC_RATE = 16000


def waterfall(summary: dict[str, Any], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per turn that played: each stage's stamp (ms after the end of
    speech; None where the turn had none: no early start), `early` (the turn
    read an early start), `early_audio` (its first sentence was synthesized
    speculatively, from the early stream: voice.speech.early_speech) and
    `overlap_ms`."""
    rows = []
    for part in v2v_breakdown(summary, events):
        turn = part["turn"]
        mine = [e for e in events if e["turn"] == turn]
        start = next((e for e in mine if e["type"] == "turn/start"), None)
        clock = next((e for e in reversed(events) if e["type"] == "audio/clock" and start is not None
                      and e["at_mono"] <= start["at_mono"]), None)
        if start is None or clock is None:
            continue
        speech_end = part["speech_end_s"]

        def after_end(at_mono: float | None) -> float | None:
            """A log time as ms after the end of speech, on the device's clock."""
            if at_mono is None:
                return None
            return round((clock["payload"]["mic"] / MIC_RATE + at_mono - clock["at_mono"] - speech_end) * 1000, 1)

        stream_start = next((e["at_mono"] for e in mine if e["type"] == "agent/assistant-stream"
                             and e["payload"].get("frame") == "start"), None)
        message = next((e["payload"] for e in mine if e["type"] in ("assistant/message", "assistant/attempt")), {})
        early = message.get("early") or {}

        def on_stream(offset_ms: float | None) -> float | None:
            return None if offset_ms is None or stream_start is None else after_end(stream_start + offset_ms / 1000)

        texts = [t for t, kind, d in message.get("stream") or [] if kind == "text" and d.strip()]
        first_text = early.get("first_text_ms") if early else (texts[0] if texts else None)
        sentence = next((e["payload"] for e in mine if e["type"] == "speech/sentence"
                         and e["payload"]["message_id"] == message.get("message_id") and e["payload"]["index"] == 0), {})
        row = {"turn": turn, "early": bool(early), "early_audio": bool(sentence.get("early")),
               "words": on_stream(early.get("words_ms")), "request": on_stream(early.get("sent_ms")),
               "first_token": on_stream(first_text), "first_sentence": after_end(sentence.get("asked")),
               "audio_ready": after_end(sentence.get("ready")), "commit": after_end(clock["at_mono"]),
               "played": round(part["v2v_ms"], 1)}
        began = row["request"] if row["request"] is not None else row["commit"]
        done = row["audio_ready"] if row["audio_ready"] is not None else row["played"]
        row["overlap_ms"] = round(max(0.0, min(done, row["commit"]) - began), 1) if early else 0.0
        rows.append(row)
    return rows


def monotone(row: dict[str, Any]) -> bool:
    """The stamps in their order of causes: the log's own (words to audio
    ready, one clock) each at or after the one before, where both are there;
    the commit after the end of speech and at or before the first sample
    (both exact on the device's clock: the commit is the turn's `audio/clock`,
    and nothing is handed to the speaker before it). The audio ready and the first sample are on two clocks: a
    replay's device tick may run late of the log's clock (summary.json
    `tick_lateness_ms_p99`), so the first may read a few ms after the second."""
    chain = [row[k] for k in CHAIN[:-1] if row[k] is not None]
    return all(a <= b for a, b in zip(chain, chain[1:])) and 0 <= row["commit"] <= row["played"]


def line(row: dict[str, Any]) -> str:
    """One turn's waterfall as a line: the stamps in their order of causes,
    the commit in its place in time among them."""
    stamps = [(k, row[k]) for k in CHAIN if row[k] is not None]
    at = next((i for i, (_, v) in enumerate(stamps) if v > row["commit"]), len(stamps))
    stamps.insert(at, ("commit", row["commit"]))
    what = ("early start, its first sentence synthesized speculatively" if row["early_audio"]
            else "early start" if row["early"] else "no early start")
    return ("end of speech 0 -> " + " -> ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in stamps)
            + f" ms  ({what}; under the end-of-turn wait: {row['overlap_ms']:.0f} ms)")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p95 (and n) of each stage over the turns that had it."""
    return {k: stats([r[k] for r in rows if r[k] is not None]) for k in (*STAGES, "overlap_ms")}
