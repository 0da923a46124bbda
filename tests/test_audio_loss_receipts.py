"""#36 point 3: a reply cut by a vanished speaker, while a tool it
dispatched still runs. The person did not ask to stop: the call runs to its
receipt (its real outcome, never `unknown` because of the loss), and the
phrase that announces the outcome is said once audio is back, or, after the
conversation's idle gap, only written down as a notice. A barge-in still
stops everything.

In the pipeline (tests/timeline.py): the replay device loses its sound card
as a scenario's `[[audio_lost]]` says, told to the session as the live
device tells it (AudioLost, AudioBack).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import anyio
import numpy as np
import pytest

from timeline import Timeline, at, default_config, run_timeline
from voice.agent.effects import effects
from voice.agent.tools.base import Receipt, Tool, ToolContext, ToolOutcome
from voice.audio.replay_device import AudioLoss
from voice.log import events as ev
from voice.log.projections import derive_messages, turn_reply
from voice.log.store import EventStore

ASK = at(0.5, "add_note.wav", "Save a note that says buy milk.")
SAY_FIRST = "Let me save that for you right now, it takes a moment."
COMPLETION = "Done, I saved your note about milk."
TOOL_S = 4.0


def slow_note(tmp_path) -> Tool:
    """A write that takes `TOOL_S` and really writes its note (a file): the
    receipt says what is there."""
    notes = tmp_path / "notes.txt"

    async def run(args: dict, ctx: ToolContext) -> ToolOutcome:
        await anyio.sleep(TOOL_S)
        with notes.open("a") as f:
            f.write(args["text"] + "\n")
        return ToolOutcome({"saved": True}, Receipt("confirmed", {"file": str(notes)}))

    return Tool("save_note_slowly", "saves a note, slowly", {"type": "object"}, "write", run)


def replies() -> list[dict]:
    return [{"text": SAY_FIRST, "chunk_delay_ms": 20,
             "tool_calls": [{"name": "save_note_slowly", "arguments": {"text": "buy milk"}}],
             "text_after_tools": COMPLETION}]


def with_gap(gap_s: float) -> dict:
    config = copy.deepcopy(default_config())
    config["conversation"]["idle_gap_s"] = gap_s
    return config


def logged(tmp_path) -> list[ev.Event]:
    """Every event of the log, in every conversation (the idle gap may end the first)."""
    store = EventStore(tmp_path / "events.db")
    try:
        return store.events()
    finally:
        store.close()


def one(events: list[ev.Event], type_: str) -> ev.Event:
    found = [e for e in events if e.type == type_]
    assert len(found) == 1, (type_, found)
    return found[0]


def phrase_played(outcome, start: int = 0, end: int | None = None) -> bool:
    """Whether a word of the completion phrase played between these speaker positions."""
    codes = [code for code, w in outcome.tts.words.items() if w.text == COMPLETION]
    return bool(codes) and bool(np.isin(outcome.played[start:end], codes).any())


def effect_of(tmp_path):
    store = EventStore(tmp_path / "events.db")
    try:
        return effects(store)
    finally:
        store.close()


def check_the_cut_and_the_receipt(outcome, tmp_path) -> None:
    """What both variants share: the reply cut as heard, no stop, the call's real receipt."""
    events = logged(tmp_path)
    lost, end = one(events, ev.AUDIO_LOST), one(events, ev.TURN_END)
    assert end.body.outcome == ev.INTERRUPTED and end.body.reason == ev.AUDIO_LOST_REASON, end
    assert not [e for e in events if e.type == ev.USER_STOP] and one(events, ev.TURN_START)
    # The call ran to its receipt after the loss: confirmed, its result ok, the note is there.
    receipt, result = one(events, ev.EFFECT_RECEIPT), one(events, ev.TOOL_RESULT)
    assert receipt.seq > lost.seq and receipt.body.state == ev.CONFIRMED, receipt
    assert result.body.status == "ok" and result.body.receipt == ev.CONFIRMED, result
    assert end.seq > receipt.seq  # the turn ended once the call had its result
    (effect,) = effect_of(tmp_path)
    assert effect.outcome == ev.CONFIRMED
    assert (tmp_path / "notes.txt").read_text() == "buy milk\n"
    # The cut reply delivers what had played before the loss, no more.
    store = EventStore(tmp_path / "events.db")
    try:
        reply = turn_reply(store, end.conversation, end.turn)
        history = json.dumps(derive_messages(store, end.conversation))
    finally:
        store.close()
    assert reply.interrupted and reply.delivered_text and SAY_FIRST.startswith(reply.delivered_text), reply
    assert reply.delivered_text != SAY_FIRST
    # The phrase is kept for the record, never history.
    (unsaid,) = [e for e in events if e.type == ev.ASSISTANT_ATTEMPT and e.body.reason == "unsaid"]
    assert unsaid.body.content == [{"type": "text", "text": COMPLETION}] and unsaid.body.receipts == [ev.CONFIRMED]
    assert COMPLETION not in history and SAY_FIRST not in history and reply.delivered_text in history


def test_a_tool_dispatched_before_the_speaker_went_runs_to_its_receipt_and_is_announced_when_audio_is_back(tmp_path):
    outcome = run_timeline(Timeline(clips=[ASK], replies=replies(), tools=[slow_note(tmp_path)],
                                    losses=(AudioLoss(at_s=3.6, back_after_s=6.0),)), tmp_path)
    check_the_cut_and_the_receipt(outcome, tmp_path)
    events = logged(tmp_path)
    back, owed = one(events, ev.AUDIO_BACK), one(events, ev.SPEECH_OWED)
    assert owed.seq > back.seq and owed.body.said == ev.OWED_ALOUD and owed.body.text == COMPLETION, owed
    assert owed.body.waited_s > 0
    # Said aloud after the back, not before: its words are in what the speaker played from then on.
    assert not phrase_played(outcome, 0, outcome.position(back)) and phrase_played(outcome, outcome.position(back))
    lines = outcome.transcript
    said = lines.index(f"notice: {COMPLETION}")
    assert said > next(i for i, line in enumerate(lines) if line.startswith("notice: audio is back")), lines
    # `voice trace` says the sound card cut the reply, not a stop (a tester read "then stopped")
    end = one(events, ev.TURN_END)
    trace = subprocess.run([sys.executable, "-m", "voice", "trace", "--db", str(tmp_path / "events.db"),
                            "--conversation", end.conversation, str(end.turn)], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert trace.returncode == 0, trace.stderr
    assert "then cut: the audio device was lost" in trace.stdout and "then stopped" not in trace.stdout, trace.stdout


def test_past_the_idle_gap_the_announcement_is_a_notice_and_is_not_spoken(tmp_path):
    outcome = run_timeline(Timeline(clips=[ASK], replies=replies(), tools=[slow_note(tmp_path)],
                                    losses=(AudioLoss(at_s=3.6, back_after_s=25.0),)), tmp_path, with_gap(10.0))
    check_the_cut_and_the_receipt(outcome, tmp_path)
    events = logged(tmp_path)
    back, owed = one(events, ev.AUDIO_BACK), one(events, ev.SPEECH_OWED)
    assert owed.seq < back.seq and owed.body.said == ev.OWED_NOTICE and owed.body.waited_s >= 10.0, owed
    assert not phrase_played(outcome)  # never spoken, before or after the back
    notes = [line for line in outcome.transcript if COMPLETION in line]
    assert notes == [f"notice: {COMPLETION} (not said: the audio device was lost)"], outcome.transcript


def test_a_stop_while_the_speaker_is_away_still_stops_the_call_at_once(tmp_path):
    """`voice ctl cancel` (the person's stop) while the call runs on after the
    loss: the barge-in protocol, as ever: the call is cancelled, its effect
    unknown, the turn aborted, and nothing is owed."""
    async def cancel_while_lost(session) -> None:
        while session.device.audio_lost() is None:
            await anyio.sleep(0.02)
        await anyio.sleep(1.0)
        assert session.agent.busy  # the call runs on, the speaker gone
        assert await session.cancel()

    outcome = run_timeline(Timeline(clips=[ASK], replies=replies(), tools=[slow_note(tmp_path)], during=cancel_while_lost,
                                    losses=(AudioLoss(at_s=3.6, back_after_s=6.0),)), tmp_path)
    events = logged(tmp_path)
    end, receipt = one(events, ev.TURN_END), one(events, ev.EFFECT_RECEIPT)
    assert end.body.outcome == ev.ABORTED and receipt.body.state == ev.UNKNOWN, (end, receipt)
    assert not (tmp_path / "notes.txt").exists()
    assert not [e for e in events if e.type == ev.SPEECH_OWED] and not phrase_played(outcome)


def test_back_before_the_call_ends_the_announcement_is_said_as_it_comes(tmp_path):
    """The speaker is back while the call still runs: the turn was cut at the
    loss all the same, and the phrase is said as soon as the receipt is in."""
    outcome = run_timeline(Timeline(clips=[ASK], replies=replies(), tools=[slow_note(tmp_path)],
                                    losses=(AudioLoss(at_s=3.6, back_after_s=1.0),)), tmp_path)
    check_the_cut_and_the_receipt(outcome, tmp_path)
    events = logged(tmp_path)
    back, receipt = one(events, ev.AUDIO_BACK), one(events, ev.EFFECT_RECEIPT)
    assert back.seq < receipt.seq
    assert not phrase_played(outcome, 0, outcome.position(receipt)) and phrase_played(outcome, outcome.position(receipt))
    # Delivered as owed (said aloud), once, and written after the cut reply's line: in the order things happened.
    owed = one(events, ev.SPEECH_OWED)
    assert owed.seq > receipt.seq and owed.body.said == ev.OWED_ALOUD and owed.body.text == COMPLETION, owed
    lines = outcome.transcript
    cut = next(i for i, line in enumerate(lines) if line.startswith("assistant:") and line.endswith("[stopped]"))
    assert lines.index(f"notice: {COMPLETION}") > cut, lines


@pytest.mark.parametrize("lost_at", [7.8, 8.5], ids=["before_it_plays", "while_it_plays"])
def test_a_confirmed_outcome_the_speaker_went_before_it_had_played_is_said_when_audio_is_back(tmp_path, lost_at):
    """The receipt is in (7.6 s) and its phrase handed to the speaker
    (synthesis takes half a second: it plays from about 8.1 s), then the
    speaker goes: before it plays or during it. The person did not stop it:
    it is owed, whole."""
    outcome = run_timeline(Timeline(clips=[ASK], replies=replies(), tools=[slow_note(tmp_path)], synth_s=0.5,
                                    losses=(AudioLoss(at_s=lost_at, back_after_s=3.0),)), tmp_path)
    events = logged(tmp_path)
    result, lost, back = one(events, ev.TOOL_RESULT), one(events, ev.AUDIO_LOST), one(events, ev.AUDIO_BACK)
    assert result.body.receipt == ev.CONFIRMED and result.seq < lost.seq
    end = one(events, ev.TURN_END)
    assert end.body.outcome == ev.INTERRUPTED and end.body.reason == ev.AUDIO_LOST_REASON, end
    played = [e for e in events if e.type == ev.SPEECH_PLAYED]
    assert not played[-1].body.complete, played  # the phrase was cut by the loss
    assert lost_at > 8.0 or played[-1].body.words == 0, played  # (a slower synthesis only plays it later)
    owed = one(events, ev.SPEECH_OWED)
    assert owed.seq > back.seq and owed.body.said == ev.OWED_ALOUD and owed.body.text == COMPLETION, owed
    # Said whole after the back: every word of it is in what played from then on.
    said = [w.word.word for w, n in outcome.tts.heard(outcome.played[outcome.position(back):])
            if w.text == COMPLETION and n == w.word.end - w.word.start]
    assert said == COMPLETION.split(), said
    lines = outcome.transcript
    cut = next(i for i, line in enumerate(lines) if line.startswith("assistant:") and line.endswith("[stopped]"))
    assert lines.index(f"notice: {COMPLETION}") > max(cut, next(
        i for i, line in enumerate(lines) if line.startswith("notice: audio is back"))), lines


def test_a_loss_into_the_reply_comes_that_far_into_it_however_late_the_reply_began(tmp_path):
    """`[[audio_lost]] into_reply` (what a real-time run needs, where a fixed
    second can fall before a slow reply): the card goes that far into the
    reply's playing, whether the reply took 0.1 s or 1.5 s to be synthesised."""
    cut_at = []
    for synth_s in (0.1, 1.5):
        run = tmp_path / f"synth{synth_s}"
        run.mkdir()
        run_timeline(Timeline(clips=[ASK], replies=replies(), tools=[slow_note(run)], synth_s=synth_s,
                              losses=(AudioLoss(at_s=None, back_after_s=1.0, into_reply_s=1.0),)), run)
        events = logged(run)
        lost = one(events, ev.AUDIO_LOST)
        began = min(e.body.start for e in events if e.type == ev.SPEECH_SENTENCE and e.body.start is not None)
        cut_at.append((began, lost.body.speaker))
    assert cut_at[1][0] - cut_at[0][0] >= 16000, cut_at  # the slower synthesis began the reply over 1 s later
    for began, speaker in cut_at:
        assert 16000 <= speaker - began <= 16000 + 320, cut_at  # one second into it, to the 20 ms block


def test_a_loss_that_says_both_when_and_into_the_reply_is_refused_by_name(tmp_path):
    from pathlib import Path

    from voice.service.scenario import load_scenario

    said = Path(__file__).resolve().parents[1] / "examples" / "barge-in" / "three_points.wav"
    scenario = tmp_path / "both.toml"
    scenario.write_text(f'[[user]]\naudio = "{said}"\nat = 0.5\n\n'
                        "[[audio_lost]]\nat = 2.0\ninto_reply = 1.0\nback_after = 1.0\n")
    with pytest.raises(ValueError, match=r"\[\[audio_lost\]\] 1 needs exactly at = SECONDS .* or into_reply"):
        load_scenario(scenario)


def test_voice_replay_says_where_each_loss_came_and_which_never_came(tmp_path):
    """From the CLI: losses in the order written (an `at` after an
    `into_reply` comes once the first is over), each `audio/lost` saying where
    it really came, and a loss the scenario ended before is a warning, not
    silence (a hostile tester's findings: the reason said "at 2 s" for a loss
    at 4.4 s; a loss never reached was dropped without a word)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    said = root / "examples" / "barge-in" / "three_points.wav"
    scenario = tmp_path / "losses.toml"
    scenario.write_text(f'[[user]]\naudio = "{said}"\nat = 0.5\n\n'
                        '[[reply]]\nchunk_delay_ms = 40\ntext = "First, the sea covers most of the planet."\n\n'
                        "[[audio_lost]]\ninto_reply = 1.0\nback_after = 0.5\n\n"
                        "[[audio_lost]]\nat = 2.0\nback_after = 0.5\n\n"
                        "[[audio_lost]]\nat = 500\nback_after = 0.5\n")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "voice", "replay", str(scenario), "--out", str(out)], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("voice: warning:")]
    assert len(warnings) == 1 and "[[audio_lost]] at = 500 never came: the scenario ended at" in warnings[0], \
        done.stderr
    assert json.loads((out / "summary.json").read_text())["device"]["losses_not_reached"] == [
        warnings[0].removeprefix("voice: warning: ")]
    store = EventStore(out / "events.db", read_only=True)
    try:
        lost = [e for e in store.events() if e.type == ev.AUDIO_LOST]
    finally:
        store.close()
    assert len(lost) == 2, lost
    assert lost[1].body.mic > lost[0].body.mic > 2.0 * 16000, lost  # the second came after the first, not at 2 s
    for e in lost:
        assert e.body.reason == f"the scenario's sound card went at {e.body.mic / 16000:g} s", e


def test_a_loss_with_an_unknown_key_is_refused_naming_the_key(tmp_path):
    from pathlib import Path

    from voice.service.scenario import load_scenario

    said = Path(__file__).resolve().parents[1] / "examples" / "barge-in" / "three_points.wav"
    scenario = tmp_path / "typo.toml"
    scenario.write_text(f'[[user]]\naudio = "{said}"\nat = 0.5\n\n'
                        "[[audio_lost]]\ninto_replay = 1.0\nback_after = 1.0\n")
    with pytest.raises(ValueError, match=r"\[\[audio_lost\]\] 1 has unknown key\(s\) \['into_replay'\]; allowed: at "
                                         r"or into_reply, and back_after"):
        load_scenario(scenario)


@pytest.mark.slow
def test_words_the_loss_cut_off_are_dropped_not_joined_to_the_next_request(tmp_path):
    """A person was mid-request when the microphone went; once it is back they
    ask again. The fragment before the loss is not part of the new request
    (benchmarks/device_faults.py heard "What time? What time is it?" in every
    cycle that killed the server while a request was spoken): it is dropped,
    written down as speech not for the assistant, and the request is heard
    alone. From the CLI, Whisper base."""
    from pathlib import Path

    from voice.audio.wav import read_mono16k, write_wav

    root = Path(__file__).resolve().parents[1]
    ask = read_mono16k(root / "tests" / "fixtures" / "audio" / "what_time.wav")
    onset = int(np.argmax(np.abs(ask) > 1000))
    cut = onset + int(0.45 * 16000)  # "What ti-": the loss comes while the person speaks
    mic = np.zeros(cut + int(0.3 * 16000) + len(ask) + 2 * 16000, np.int16)
    mic[:cut] = ask[:cut]
    again = cut + int(0.3 * 16000)  # asked again 0.3 s after the microphone is back
    mic[again:again + len(ask)] = ask
    write_wav(tmp_path / "track.wav", mic, 16000)
    scenario = tmp_path / "cut.toml"
    scenario.write_text('timing = "recorded"\n\n[[user]]\naudio = "track.wav"\nat = 0.0\n\n'
                        f"[[audio_lost]]\nat = {cut / 16000}\nback_after = 1.0\n\n"
                        '[[reply]]\nchunk_delay_ms = 20\ntext = "It is noon."\n')
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "voice", "replay", str(scenario), "--out", str(out)], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    turns = json.loads((out / "summary.json").read_text())["turns"]
    assert [(t["user_text"], t["delivered_text"]) for t in turns] == [("What time is it?", "It is noon.")], turns
    store = EventStore(out / "events.db", read_only=True)
    try:
        speech = [e.body for e in store.events() if e.type == ev.LISTEN_SPEECH]
        lost, = [e.body for e in store.events() if e.type == ev.AUDIO_LOST]
    finally:
        store.close()
    # the fragment: its own stretch of speech, ended at the loss, not for the assistant; then the request
    assert [(s.start < lost.mic <= s.end + 640, s.for_assistant) for s in speech] == [(True, False), (False, True)], \
        (speech, lost)
