"""The turn picture's data: what `voice.show.load` takes from a real SQLite
log (with the events it proposes, and with only today's events) and from a
real `voice replay` output directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from show_log import CONVERSATION, CUT_WORD, DELIVERED, HEARD, QUEUED, TURN, UNSAID, write_replay_dir, write_turn
from voice.errors import UsageError
from voice.log.events import EVENT_TYPES
from voice.log.store import EventStore
from voice.show.load import PICTURE_TYPES, from_log, from_replay_dir

REPO = Path(__file__).resolve().parent.parent


def load(tmp_path: Path, *, proposed: bool = True, summary: bool = True):
    written = write_turn(tmp_path, proposed=proposed)
    store = EventStore(tmp_path / "events.db")
    try:
        return from_log(store, CONVERSATION, TURN, mic=written.mic, speaker=written.speaker,
                        summary=written.summary if summary else None)
    finally:
        store.close()


def test_words_are_heard_cut_queued_or_unsaid(tmp_path):
    t = load(tmp_path)
    states = [(w.text, w.state) for w in t.words]
    n = len(HEARD)
    assert states[:n] == [(w, "heard") for w in HEARD]
    assert states[n] == (CUT_WORD, "cut")
    assert states[n + 1:n + 1 + len(QUEUED)] == [(w, "queued") for w in QUEUED]
    assert states[n + 1 + len(QUEUED):] == [(w, "unsaid") for w in UNSAID]
    # what the audio says was heard is what the log recorded as delivered
    assert " ".join(w.text for w in t.heard_words) == DELIVERED == t.delivered
    cut = t.words[n]
    assert (cut.start_s, cut.end_s) == pytest.approx((8.75, 8.8))  # it played until the output paused
    assert all(w.start_s is None for w in t.words[n + 1:])


def test_a_resumed_pause_holds_back_the_words_after_it(tmp_path):
    t = load(tmp_path)
    second = [w for w in t.words if w.start_s is not None and 7.0 <= w.start_s < 8.5]
    assert [(w.text, round(w.start_s, 3), round(w.end_s, 3)) for w in second] == [
        ("Second,", 7.0, 7.25), ("it", 7.25, 7.5),  # paused at 7.5 s, resumed at 8.0 s
        ("is", 8.0, 8.25), ("wide.", 8.25, 8.5)]


def test_barge_in_marks_carry_the_acknowledgement(tmp_path):
    t = load(tmp_path)
    assert [(m.kind, m.at_s, m.ack_ms) for m in t.marks] == [
        ("pause", 7.5, 50.0), ("resume", 8.0, 550.0),
        ("pause", 8.8, 100.0), ("confirm", 9.3, 600.0), ("clear", 9.32, 620.0)]
    assert t.marks[1].reason == "heard 'mm-hmm'"
    assert t.aborted and t.outcome == "aborted"


def test_tool_calls_are_placed_on_the_device_clock_with_their_receipts(tmp_path):
    (tool,) = load(tmp_path).tools
    assert (tool.name, tool.status, tool.receipt) == ("add_note", "ok", "confirmed")
    assert json.loads(tool.arguments) == {"text": "the sea"}
    assert (tool.dispatch_s, tool.result_s) == pytest.approx((3.9, 4.1))


def test_latency_parts_run_from_the_last_word_to_the_first_sound(tmp_path):
    parts = load(tmp_path).latency.parts()
    assert [name for name, _, _ in parts] == ["end of turn", "recognition", "first token", "first audio"]
    assert [round((end - start) * 1000) for _, start, end in parts] == [600, 400, 200, 400]


def test_the_person_side_speech_wake_word_and_utterance(tmp_path):
    t = load(tmp_path)
    assert [(s.start_s, s.end_s) for s in t.speech] == [(0.6, 2.4), (7.45, 7.7), (8.7, 9.6)]
    assert t.wake_s == 0.8
    assert (t.utterance.text, t.utterance.start_s, t.utterance.end_s) == (
        "Take a note and tell me about the sea.", 0.6, 3.0)
    assert t.window.start_s == 0.0 and t.window.end_s > 9.6
    assert t.mic.start_s == t.window.start_s and t.mic.end_s == pytest.approx(t.window.end_s, abs=1e-3)


def test_a_log_with_the_picture_events_leaves_no_gaps(tmp_path):
    assert load(tmp_path).gaps == ()
    store = EventStore(tmp_path / "events.db")
    types = {e.type for e in store.events()}
    store.close()
    assert types <= EVENT_TYPES  # the test log speaks the log's vocabulary
    assert PICTURE_TYPES <= types
    for e in EventStore(tmp_path / "events.db").events():  # and every row parses as its typed body
        assert e.body.TYPE == e.type


def test_todays_log_draws_what_it_has_and_names_what_it_lacks(tmp_path):
    t = load(tmp_path, proposed=False)
    assert t.words == ()  # no word is placed without its play time
    assert t.delivered == DELIVERED and t.aborted
    assert (t.utterance.start_s, t.utterance.end_s) == (0.6, 3.0)  # summary.json
    assert [(m.kind, m.at_s, m.ack_ms) for m in t.marks] == [("pause", 8.8, 100.0)]  # summary.json's stop_s
    gaps = "\n".join(t.gaps)
    for missing in ("speech/sentence", "audio/clock", "listen/speech", "speech/confirmed", "speech/cleared",
                    "onsets were at 7.45 s"):
        assert missing in gaps
    (tool,) = t.tools  # placed by taking turn/start as the end of recognition: exact in this log
    assert tool.dispatch_s == pytest.approx(3.9)


def test_without_summary_nothing_is_invented(tmp_path):
    t = load(tmp_path, proposed=False, summary=False)
    assert t.marks == ()
    assert (t.utterance.start_s, t.utterance.end_s) == (None, None)
    assert all(m is None for m in (t.latency.decided_s, t.latency.transcript_s, t.latency.first_token_s))
    assert t.tools[0].dispatch_s is None
    assert any("pause(s) not placed" in g for g in t.gaps)


def test_a_replay_directory_loads(tmp_path):
    written = write_replay_dir(tmp_path)
    t = from_replay_dir(tmp_path, TURN)
    assert (t.mic.samples[:100] == written.mic.samples[:100]).all()
    assert t.speaker.rate == 16000 and len(t.heard_words) == len(HEARD)


def test_bad_directory_or_turn_is_one_clear_line(tmp_path):
    with pytest.raises(UsageError, match="has no events.db: give the --out directory"):
        from_replay_dir(tmp_path, 1)
    write_replay_dir(tmp_path)
    with pytest.raises(UsageError, match="turn 7 is not in .*; its turns are 1$"):
        from_replay_dir(tmp_path, 7)
    (tmp_path / "played.wav").write_bytes(b"not a wav")
    with pytest.raises(UsageError, match="played.wav is not a readable WAV file"):
        from_replay_dir(tmp_path, 1)
    (tmp_path / "played.wav").unlink()
    for name in ("events.db-wal", "events.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    (tmp_path / "events.db").write_bytes(b"not a database" * 100)
    with pytest.raises(UsageError, match="cannot open the event log"):
        from_replay_dir(tmp_path, 1)


@pytest.mark.slow
def test_the_barge_in_demo_is_drawn_from_its_log_alone(tmp_path):
    """The README demo through `voice replay` (a real subprocess, real
    models): every part of the picture comes from the events the session
    wrote, and agrees with the replay's own account (summary.json, which the
    loader no longer needs)."""
    out = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "voice", "replay", str(REPO / "examples/barge-in/scenario.toml"),
                           "--out", str(out)], check=True, capture_output=True, text=True, timeout=240)
    summary = json.loads((out / "summary.json").read_text())["turns"][0]
    # each time says what it counts from: the replay's from the clip, the picture's marks from the VAD
    assert (f"turn 1: stopped {summary['ack_ms']} ms after the barge-in began (its clip's first loud sample; "
            "the picture's marks count from the VAD's onset)") in done.stdout, done.stdout
    (out / "summary.json").unlink()
    t = from_replay_dir(out, summary["turn"])
    assert t.gaps == ()
    assert t.utterance.text == summary["user_text"]
    assert (t.utterance.start_s, t.utterance.end_s) == (summary["user_start_s"], summary["user_end_s"])
    assert t.delivered == summary["delivered_text"] and t.aborted
    assert t.reply_text == summary["generated_text"]
    # the words placed by speech/sentence as heard are exactly the delivered prefix the log recorded
    assert " ".join(w.text for w in t.heard_words) == summary["delivered_text"]
    assert [m.kind for m in t.marks] == ["pause", "confirm", "clear"]
    pause, confirm, clear = t.marks
    assert pause.at_s == summary["stop_s"]
    # the VAD's onset estimate, within its start_secs of the clip's first loud sample
    assert abs(pause.onset_s - summary["barge_in_s"]) <= 0.25
    assert pause.at_s < confirm.at_s <= clear.at_s + 0.02  # the cut follows the decision within a block
    assert t.latency.first_audio_s == summary["speech_start_s"]
    assert [name for name, _, _ in t.latency.parts()] == ["end of turn", "recognition", "first token", "first audio"]
    assert any(s.start_s == pause.onset_s for s in t.speech)  # the speech region that cut it
    assert t.speaker.start_s <= summary["speech_start_s"] < summary["stop_s"] <= t.speaker.end_s
    assert abs(t.speaker.samples).max() > 1000  # the reply played inside the window
