"""Fill a `TurnTimeline` from the event log and the recording.

`from_replay_dir(DIR, TURN)` reads what `voice replay --out DIR` writes:
events.db (the log), mic.wav (the microphone before echo cancellation) and
played.wav (what the speaker played), both on the device's sample clock from
position 0, and summary.json. `from_log(store, conversation, turn, ...)` does
the same from any log and recording.

What today's log gives the picture: the transcript (`user/message`), the
reply's text (the timed `stream` of `assistant/message` and aborted
`assistant/attempt`), the delivered prefix (`speech/played` applied, as
`turn_reply` derives it), the outcome (`turn/end`), the speech onsets that
paused the output (`speech/paused`, `speech/resumed`: `onset`), tool calls
with their dispatch, result and receipt (`tool/*`, `effect/receipt`), and the
model's first token (stream offsets, in ms from the stream's start frame).
summary.json adds, for replays only: the utterance's span and recognition
time, the first played sample, and where the output stopped after the
barge-in that ended the turn.

What the session writes for the picture (voice/log/events.py; the table in
docs/EVENTS.md). Positions are sample counts from the device's start:
mic positions at 16 kHz, speaker positions at the playback buffer's rate.

- `audio/clock` (mic, speaker, speaker_rate, output_latency): pairs the
  sample clock with the event's `at_mono`; written when the session starts
  listening and before each turn. Without one (older logs), log times are
  placed by assuming `turn/start` was logged when recognition finished, and
  the picture says so.
- `listen/speech` (start, end, decided, for_assistant): one VAD speech region.
- `listen/wake` (position, model): the wake word fired.
- `user/message` `audio` {start, end, stt_ms}: the utterance's span and
  recognition time, for voice turns.
- `speech/paused` and `speech/resumed` `at`: the speaker position.
- `speech/confirmed` (onset, at, reason): `at` is the mic position where the
  judge decided (from the voiced length, or from the words once recognised).
- `speech/cleared` (at, onset): the cut, at that speaker position.
- `speech/sentence` (message_id, index, char_start, char_end, start, length,
  handed, method, words): one synthesized sentence of an assistant message
  and where it played; each word's `start`/`end` are samples from the
  sentence's first sample. A pause shifts the later samples by the pause's
  length; the loader applies the pauses, so the writer need not.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice.audio.recording import read_recording_info
from voice.audio.wav import BadAudio, read_mono16k
from voice.errors import UsageError, as_usage_error
from voice.log import events as ev
from voice.log.events import Event
from voice.log.projections import turn_reply
from voice.log.store import EventStore
from voice.show.timeline import (
    MIC_RATE,
    BargeInMark,
    Latency,
    ReplyWord,
    Span,
    ToolMark,
    TurnTimeline,
    Utterance,
    Waveform,
)

# What the picture reads beyond the turn's own record (older logs lack them: see the docstring).
AUDIO_CLOCK, LISTEN_SPEECH, LISTEN_WAKE = ev.AUDIO_CLOCK, ev.LISTEN_SPEECH, ev.LISTEN_WAKE
SPEECH_CONFIRMED, SPEECH_CLEARED, SPEECH_SENTENCE = ev.SPEECH_CONFIRMED, ev.SPEECH_CLEARED, ev.SPEECH_SENTENCE
PICTURE_TYPES = frozenset({AUDIO_CLOCK, LISTEN_SPEECH, LISTEN_WAKE, SPEECH_CONFIRMED, SPEECH_CLEARED, SPEECH_SENTENCE})

CONTEXT_S = 1.0  # drawn before the turn
CONTEXT_AFTER_S = 2.0  # and after it: room for the words that were not heard


def from_replay_dir(path: str | Path, turn: int) -> TurnTimeline:
    """The timeline of `turn` from a `voice replay --out` directory (or a
    saved recording: `voice run --record`, `voice ctl save`)."""
    path = Path(path)
    db = path / "events.db"
    if not db.is_file():
        raise UsageError(f"{path} has no events.db: give the --out directory of `voice replay` or a recording")
    with as_usage_error(ValueError):  # not a log, or one written by a newer voice
        store = EventStore(db, read_only=True)
    try:
        conversations = store.conversations_of_turn(turn)
        if not conversations:
            known = sorted({e.turn for e in store.events(types={ev.TURN_START}) if e.turn is not None})
            raise UsageError(f"turn {turn} is not in {db}; its turns are {', '.join(map(str, known)) or 'none'}")
        return from_store(store, conversations[0], turn)
    finally:
        store.close()


def from_store(store: EventStore, conversation: str, turn: int) -> TurnTimeline:
    """The timeline of `turn` from an open log, with the recording that sits
    beside it, if any: mic.wav and played.wav (placed on the device clock by
    recording.json when they start later than the device did, as a saved
    ring does) and a replay's summary.json."""
    path = store.path.parent
    with as_usage_error(ValueError):
        starts = read_recording_info(path)
    mic = _read_wav(path / "mic.wav", starts.get("mic_start", 0))
    speaker = _read_wav(path / "played.wav", starts.get("played_start", 0))
    summary = None
    if (path / "summary.json").is_file():
        try:
            summary = json.loads((path / "summary.json").read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"{path / 'summary.json'} is not readable JSON ({exc}): "
                             "run `voice replay` again") from None
    summary_turn = next((t for t in (summary or {}).get("turns", []) if t.get("turn") == turn), None)
    if summary_turn is not None:  # how the replay's clock ran: "recorded" when inference took no time on it
        summary_turn = {**summary_turn, "timing": (summary or {}).get("device", {}).get("timing")}
    return from_log(store, conversation, turn, mic=mic, speaker=speaker, summary=summary_turn)


def _read_wav(path: Path, start: int = 0) -> Waveform | None:
    if not path.is_file():
        return None
    with as_usage_error(BadAudio):
        return Waveform(read_mono16k(path), MIC_RATE, start / MIC_RATE)


def from_log(store: EventStore, conversation: str, turn: int, *, mic: Waveform | None = None,
             speaker: Waveform | None = None, summary: dict[str, Any] | None = None) -> TurnTimeline:
    """`summary` is the turn's entry of a replay's summary.json, used only for
    what the log lacks (and then named in the timeline's `gaps`)."""
    events = store.events(conversation)
    ev.check_readable(events)  # every body parsed now: a damaged row is said before anything is drawn
    mine = [e for e in events if e.turn == turn]
    if not mine:
        raise UsageError(f"turn {turn} is not in conversation {conversation}")
    return _Builder(events, mine, summary or {}).build(store, conversation, turn, mic, speaker)


@dataclass
class _Clock:
    """Maps an event's `at_mono` to the device clock through anchors
    (at_mono, device seconds): the latest anchor at or before the event, or
    the first one."""

    anchors: list[tuple[float, float]]

    def at(self, at_mono: float) -> float:
        keys = [a for a, _ in self.anchors]
        i = max(0, bisect.bisect_right(keys, at_mono) - 1)
        mono, device = self.anchors[i]
        return device + (at_mono - mono)


class _Builder:
    def __init__(self, events: list[Event], mine: list[Event], summary: dict[str, Any]):
        self.events, self.mine, self.summary = events, mine, summary
        self.gaps: list[str] = []
        clocks = [e for e in events if e.type == AUDIO_CLOCK]
        self.speaker_rate = clocks[-1].body.speaker_rate if clocks else MIC_RATE
        self.clock = _Clock([(e.at_mono, e.body.mic / MIC_RATE) for e in clocks]) if clocks else None

    def of_type(self, *types: str, turn_only: bool = True) -> list[Event]:
        return [e for e in (self.mine if turn_only else self.events) if e.type in types]

    def speaker_s(self, position: int) -> float:
        return position / self.speaker_rate

    def build(self, store: EventStore, conversation: str, turn: int, mic: Waveform | None,
              speaker: Waveform | None) -> TurnTimeline:
        utterance, recognition_s = self._utterance()
        if self.clock is None:
            self._estimate_clock(utterance, recognition_s)
        speech, speech_end_s = self._speech(utterance)
        pauses = self._pause_intervals()
        messages = self._messages()
        words = self._words(messages, pauses)
        marks = self._marks()
        tools = self._tools()
        first_audio = self._first_audio()
        decided = utterance.end_s if utterance else None
        transcript = self._transcript_s(decided, recognition_s)
        latency = Latency(
            speech_end_s=speech_end_s,
            decided_s=decided,
            transcript_s=transcript,
            first_token_s=self._first_token(),
            first_audio_s=first_audio,
            recognition_ms=recognition_s * 1000 if recognition_s is not None else None,
            # recognition ran longer than the wait it left after the decision: it began before it
            speculative=None not in (decided, transcript, recognition_s)
            and recognition_s > transcript - decided + 0.05,
            replayed=self.summary.get("timing") == "recorded",
        )
        end = self.of_type(ev.TURN_END)
        reply = turn_reply(store, conversation, turn)
        window = self._window(utterance, words, marks, tools, latency, end, mic or speaker)
        wake = self._wake(utterance)
        return TurnTimeline(
            turn=turn,
            conversation=conversation,
            window=window,
            mic=mic.window(window.start_s, window.end_s) if mic else None,
            speaker=speaker.window(window.start_s, window.end_s) if speaker else None,
            speech=tuple(s for s in speech if s.end_s > window.start_s and s.start_s < window.end_s),
            wake_s=wake,
            utterance=utterance,
            reply_text=" ".join(text for _, text in messages if text.strip()),
            words=tuple(words),
            marks=tuple(sorted(marks, key=lambda m: m.at_s)),
            delivered=reply.delivered_text,
            aborted=reply.outcome == ev.ABORTED,
            outcome=reply.outcome,
            tools=tuple(tools),
            latency=latency,
            gaps=tuple(self.gaps),
        )

    # -- the person ----------------------------------------------------------

    def _utterance(self) -> tuple[Utterance | None, float | None]:
        user = next(iter(self.of_type(ev.USER_MESSAGE)), None)
        if user is None:
            return None, None
        said: ev.UserMessage = user.body
        text, audio = said.content, said.audio
        if audio is not None:
            stt_ms = audio.get("stt_ms")
            return (Utterance(text, audio["start"] / MIC_RATE, audio["end"] / MIC_RATE),
                    stt_ms / 1000 if stt_ms is not None else None)
        if said.source != "voice":
            return Utterance(text), None  # typed: nothing was heard
        s = self.summary
        if "user_start_s" in s:
            self.gaps.append("utterance span and recognition time: from summary.json "
                             "(the log's user/message has no \"audio\")")
            return Utterance(text, s["user_start_s"], s["user_end_s"]), s.get("stt_s")
        self.gaps.append("utterance span and recognition time: not in the log (user/message has no \"audio\")")
        return Utterance(text), None

    def _transcript_s(self, decided: float | None, recognition_s: float | None) -> float | None:
        """When the words were known: the turn starts once recognition is done,
        so its turn/start on the device clock, where the clock is known (with
        speculative recognition, the recognition began before the end of turn
        and is done sooner than its own duration after it); else the end of
        turn plus the recognition time."""
        start = next(iter(self.of_type(ev.TURN_START)), None)
        if self.clock is not None and start is not None and decided is not None:
            return max(decided, self.clock.at(start.at_mono))
        if decided is None or recognition_s is None:
            return None
        return decided + recognition_s

    def _estimate_clock(self, utterance: Utterance | None, recognition_s: float | None) -> None:
        start = next(iter(self.of_type(ev.TURN_START)), None)
        if start is None or utterance is None or utterance.end_s is None or recognition_s is None:
            self.gaps.append("clock: no audio/clock event and no recognised utterance to anchor on; "
                             "log times (first token, tools) are left out")
            return
        self.clock = _Clock([(start.at_mono, utterance.end_s + recognition_s)])
        self.gaps.append("clock: no audio/clock event; log times (first token, tools) are placed by "
                         "taking turn/start as the end of recognition")

    def _speech(self, utterance: Utterance | None) -> tuple[list[Span], float | None]:
        regions = self.of_type(LISTEN_SPEECH, turn_only=False)
        if not regions:
            self.gaps.append("speech regions, wake word and the end-of-turn wait: the log has no "
                             "listen/speech or listen/wake events")
            return [], None
        spans = [Span(e.body.start / MIC_RATE, e.body.end / MIC_RATE) for e in regions]
        speech_end = None
        if utterance is not None and utterance.start_s is not None:
            own = min(regions, key=lambda e: abs(e.body.start / MIC_RATE - utterance.start_s))
            speech_end = own.body.end / MIC_RATE
        return spans, speech_end

    def _wake(self, utterance: Utterance | None) -> float | None:
        wakes = [e.body.position / MIC_RATE for e in self.of_type(LISTEN_WAKE, turn_only=False)]
        if utterance is None or utterance.end_s is None:
            return None
        before = [w for w in wakes if w <= utterance.end_s]
        return max(before) if before else None

    # -- the reply -----------------------------------------------------------

    def _messages(self) -> list[tuple[str, str]]:
        """(message_id, the text handed to the surface) of each message of
        the turn that may have been spoken, in order."""
        out = []
        for e in self.of_type(ev.ASSISTANT_MESSAGE, ev.ASSISTANT_ATTEMPT):
            if e.type == ev.ASSISTANT_ATTEMPT and e.body.reason != "aborted":
                continue  # a failed attempt: its queued speech was dropped, nothing of it is the reply
            text = "".join(d for _, kind, d in e.body.stream or [] if kind == "text")
            out.append((e.body.message_id, text))
        return out

    def _pause_intervals(self) -> list[tuple[int, int | None]]:
        """(paused at, resumed at) speaker positions: output held in between."""
        pauses = sorted(e.body.at for e in self.of_type(ev.SPEECH_PAUSED) if e.body.at is not None)
        resumes = sorted(e.body.at for e in self.of_type(ev.SPEECH_RESUMED) if e.body.at is not None)
        out = []
        for p in pauses:
            r = next((r for r in resumes if r >= p), None)
            out.append((p, r))
        return out

    def _words(self, messages: list[tuple[str, str]], pauses: list[tuple[int, int | None]]) -> list[ReplyWord]:
        sentences: dict[str, list[ev.SpeechSentence]] = {}
        for e in self.of_type(SPEECH_SENTENCE):
            sentences.setdefault(e.body.message_id, []).append(e.body)
        if not sentences:
            if any(text.strip() for _, text in messages):
                self.gaps.append("word play times: the log has no speech/sentence events; the reply is shown "
                                 "as text, the delivered prefix apart from the rest")
            return []
        words: list[ReplyWord] = []
        for message_id, text in messages:
            ordered = sorted(sentences.get(message_id, []), key=lambda s: s.index)
            timed = [(s, w) for s in ordered for w in s.words]
            for m in re.finditer(r"\S+", text):
                hit = next(((s, w) for s, w in timed if w[0] < m.end() and w[1] > m.start()), None)
                words.append(self._word(m.group(), hit, pauses))
        return words

    def _word(self, text: str, hit: tuple[ev.SpeechSentence, list[int]] | None,
              pauses: list[tuple[int, int | None]]) -> ReplyWord:
        if hit is None:
            return ReplyWord(text, "unsaid")
        sentence, (_, _, w_start, w_end) = hit
        start, handed = sentence.start, sentence.handed
        if start is None or handed <= w_start:
            return ReplyWord(text, "queued")
        state = "heard" if w_end <= handed else "cut"
        at = self.speaker_s(_placed(start, w_start, pauses))
        until = self.speaker_s(_placed(start, min(w_end, handed) - 1, pauses) + 1)
        return ReplyWord(text, state, at, until)

    def _first_audio(self) -> float | None:
        starts = [s.start for s in (e.body for e in self.of_type(SPEECH_SENTENCE)) if s.start is not None]
        if starts:
            return self.speaker_s(min(starts))
        return self.summary.get("speech_start_s")

    def _first_token(self) -> float | None:
        if self.clock is None:
            return None
        starts = {(e.step, e.attempt): e.at_mono for e in self.of_type(ev.ASSISTANT_STREAM)
                  if e.body.frame == "start"}
        for e in self.of_type(ev.ASSISTANT_MESSAGE, ev.ASSISTANT_ATTEMPT):
            begun = starts.get((e.step, e.attempt))
            offsets = [offset for offset, kind, d in e.body.stream or [] if kind == "text" and d.strip()]
            if begun is not None and offsets:
                return self.clock.at(begun + offsets[0] / 1000)
        return None

    # -- barge-in ------------------------------------------------------------

    def _marks(self) -> list[BargeInMark]:
        marks: list[BargeInMark] = []
        paused = self.of_type(ev.SPEECH_PAUSED)
        untimed = [e for e in paused if e.body.at is None]
        for e in paused:
            if e.body.at is not None:
                marks.append(BargeInMark("pause", self.speaker_s(e.body.at), e.body.onset / MIC_RATE))
        if untimed and self.summary.get("stop_s") is not None:
            # summary.json's stop_s: where the output stopped after the onset of
            # the barge-in that ended the turn (the last pause)
            marks.append(BargeInMark("pause", self.summary["stop_s"], untimed.pop().body.onset / MIC_RATE))
            self.gaps.append("barge-in: the last pause's time is from summary.json (speech/paused has no \"at\")")
        if untimed:
            self.gaps.append(f"barge-in: {len(untimed)} pause(s) not placed (speech/paused has no \"at\"); "
                             "their speech onsets were at " + ", ".join(
                                 f"{e.body.onset / MIC_RATE:.2f} s" for e in untimed))
        for e in self.of_type(ev.SPEECH_RESUMED):
            if e.body.at is not None:
                marks.append(BargeInMark("resume", self.speaker_s(e.body.at), e.body.onset / MIC_RATE, e.body.reason))
        for e in self.of_type(SPEECH_CONFIRMED):
            marks.append(BargeInMark("confirm", e.body.at / MIC_RATE, e.body.onset / MIC_RATE, e.body.reason))
        for e in self.of_type(SPEECH_CLEARED):
            onset = e.body.onset
            marks.append(BargeInMark("clear", self.speaker_s(e.body.at),
                                     onset / MIC_RATE if onset is not None else None))
        if paused and not self.of_type(SPEECH_CONFIRMED, SPEECH_CLEARED):
            self.gaps.append("barge-in: the confirm and the clear (cut) are not in the log "
                             "(speech/confirmed, speech/cleared)")
        return marks

    # -- tools ---------------------------------------------------------------

    def _tools(self) -> list[ToolMark]:
        calls: dict[str, dict[str, Any]] = {}
        for e in self.of_type(ev.TOOL_CALL, ev.TOOL_DISPATCH, ev.TOOL_RESULT, ev.EFFECT_RECEIPT):
            body = e.body
            call = calls.setdefault(body.tool_call_id, {"name": body.name or "?"})
            at = self.clock.at(e.at_mono) if self.clock is not None else None
            if isinstance(body, ev.ToolCalled):
                call["arguments"] = body.arguments
            elif isinstance(body, ev.ToolDispatched):
                call["dispatch_s"] = at
                call.setdefault("arguments", json.dumps(body.arguments))
            elif isinstance(body, ev.ToolResult):
                call["result_s"], call["status"] = at, body.status
                call.setdefault("receipt", body.receipt)
            elif body.phase == "dispatch":
                call["receipt"] = body.state
        return [ToolMark(c["name"], c.get("arguments", ""), c.get("dispatch_s"), c.get("result_s"),
                         c.get("status"), c.get("receipt")) for c in calls.values()]

    # -- the window ----------------------------------------------------------

    def _window(self, utterance, words, marks, tools, latency, end, recording: Waveform | None) -> Span:
        times = [m.at_s for m in marks] + [w.end_s for w in words if w.end_s is not None]
        times += [t for tool in tools for t in (tool.dispatch_s, tool.result_s) if t is not None]
        times += [t for t in (latency.speech_end_s, latency.first_token_s, latency.first_audio_s) if t is not None]
        times += [t for t in (self.summary.get("speech_end_s"),) if t is not None]
        if utterance is not None:
            times += [t for t in (utterance.start_s, utterance.end_s) if t is not None]
        if end and self.clock is not None:
            times.append(self.clock.at(end[0].at_mono))
        # Never an empty span (a typed turn, no recording: nothing has a time):
        # the axes need one, and a zero-width one draws as -0.04..0.04 s.
        least = CONTEXT_S + CONTEXT_AFTER_S
        if not times:
            return Span(0.0, max(recording.end_s if recording else 0.0, least))
        start, stop = max(0.0, min(times) - CONTEXT_S), max(times) + CONTEXT_AFTER_S
        if recording is not None:
            stop = min(stop, recording.end_s)
        return Span(start, max(stop, start + least))


def _placed(start: int, offset: int, pauses: list[tuple[int, int | None]]) -> int:
    """The speaker position of a sentence's sample `offset`, given it began
    at `start`: each pause before that sample holds it back by the pause's
    length."""
    position = start + offset
    for paused, resumed in pauses:
        if start <= paused <= position and resumed is not None:
            position += resumed - paused
    return position

