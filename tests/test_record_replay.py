"""Record a session and replay it (issue #18), with real processes and real
models: `voice run --replay` (the replay device in real time, so the
service's timing is a live one) with `--record DIR`, or its in-memory ring
saved by `voice ctl save DIR`; then `voice replay DIR/scenario.toml` must
give the same turns, the same delivered words (±1) and the same barge-in
decisions. The live-audio version is in tests/live/test_live_barge_in.py."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest

from replayed import assert_same_outcome, read_session
from test_service import Daemon, voice

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "barge-in" / "scenario.toml"


def converse(daemon: Daemon) -> None:
    """The demo's two turns, the second played out."""
    daemon.pump(lambda: sum(line.startswith("assistant:") for line in daemon.out) >= 2, timeout=150)
    time.sleep(1.0)


def replay(tmp: Path, saved: Path) -> Path:
    out = tmp / "replayed"
    done = voice(tmp, "replay", str(saved / "scenario.toml"), "--out", str(out), timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"using the recorded settings in {saved / 'config.toml'}" in done.stderr
    return out


def private(directory: Path) -> dict[str, int]:
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}
    return {"dir": stat.S_IMODE(directory.stat().st_mode), **modes}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_recorded_session_replays_to_the_same_outcome(tmp_path):
    rec = tmp_path / "rec"
    daemon = Daemon(tmp_path / "d", DEMO, extra_args=("--record", str(rec)))
    converse(daemon)
    refused = voice(tmp_path / "d", "ctl", "save", str(tmp_path / "also"))
    assert refused.returncode == 1 and f"records everything to {rec}" in refused.stderr, refused.stderr
    assert not (tmp_path / "also").exists()
    assert daemon.stop() < 20 and daemon.proc.returncode == 0, daemon.err_text()
    assert any(line.startswith(f"recorded ") and "voice replay" in line for line in daemon.err), daemon.err_text()
    assert private(rec) == {"dir": 0o700, **dict.fromkeys(
        ("mic.wav", "played.wav", "mic_blocks.txt", "recording.json", "events.db", "scenario.toml", "config.toml"),
        0o600)}
    recorded = read_session(rec / "events.db")
    assert recorded == read_session(daemon.db)  # the copy holds this session's events
    assert [t.outcome for t in recorded.turns] == ["aborted", "completed"] and recorded.turns[0].interrupted
    assert ("speech/confirmed", recorded.decisions[0][1]) in recorded.decisions

    out = replay(tmp_path, rec)
    assert_same_outcome(recorded, read_session(out / "events.db"))
    shown = voice(tmp_path, "show", "1", "--db", str(rec / "events.db"), "--out", str(tmp_path / "turn.html"))
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr  # the recording draws with no gaps
    assert 'id="speaker-waveform"' in (tmp_path / "turn.html").read_text()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ctl_save_writes_the_ring_out_after_the_fact_and_it_replays(tmp_path):
    daemon = Daemon(tmp_path / "d", DEMO)
    try:
        converse(daemon)
        saved = tmp_path / "bug"
        done = voice(tmp_path / "d", "ctl", "save", str(saved))
        assert done.returncode == 0, done.stderr
        assert f"to {saved} (turns: 1, 2); replay it with: voice replay {saved}/scenario.toml" in done.stdout
        again = voice(tmp_path / "d", "ctl", "save", str(saved))
        assert again.returncode == 1 and again.stderr.strip().endswith(
            "is not empty: give a new directory, so recordings are never mixed"), again.stderr
        as_json = voice(tmp_path / "d", "ctl", "save", str(tmp_path / "second"), "--json")
        assert json.loads(as_json.stdout)["turns"] == [1, 2]
    finally:
        assert daemon.stop() < 20, daemon.err_text()
    assert private(saved)["dir"] == 0o700 and set(private(saved).values()) == {0o700, 0o600}
    info = json.loads((saved / "recording.json").read_text())
    assert info["mic_start"] == 0  # 120 s of ring hold the whole demo
    recorded = read_session(saved / "events.db")
    assert [t.outcome for t in recorded.turns] == ["aborted", "completed"]
    assert_same_outcome(recorded, read_session(replay(tmp_path, saved) / "events.db"))


def test_record_into_a_directory_that_holds_something_is_refused_before_anything_starts(tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    done = voice(tmp_path, "run", "--replay", str(DEMO), "--record", str(used), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"voice: error: --record: {used} is not empty: give a new directory, so recordings are never mixed"]
    assert (used / "keep.txt").read_text() == "mine" and sorted(p.name for p in used.iterdir()) == ["keep.txt"]


def test_ctl_save_needs_one_directory(tmp_path):
    done = voice(tmp_path, "ctl", "save")
    assert done.returncode == 2
    assert done.stderr.strip() == "voice: error: voice ctl save needs one new directory, e.g. voice ctl save ~/voice-bug"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_committed_live_recording_replays_in_ci(tmp_path):
    """tests/fixtures/recorded/live-barge-in: `voice run --record` on the real
    sounddevice stream against virtual PipeWire devices (written by
    tests/live/test_live_barge_in.py): a question, "Stop. Tell me something
    else instead." over the answer, the second answer. Replayed here with no
    sound card, it gives what the live session gave."""
    recording = ROOT / "tests" / "fixtures" / "recorded" / "live-barge-in"
    recorded = read_session(recording / "events.db")
    assert [t.outcome for t in recorded.turns] == ["aborted", "completed"] and recorded.turns[0].interrupted
    assert_same_outcome(recorded, read_session(replay(tmp_path, recording) / "events.db"))


def test_voice_show_draws_a_logged_turn_and_says_what_an_older_log_lacks(tmp_path):
    from show_log import write_turn

    write_turn(tmp_path / "new")
    done = voice(tmp_path, "show", "1", "--db", str(tmp_path / "new" / "events.db"), "--out",
                 str(tmp_path / "t.html"), "--png", str(tmp_path / "t.png"))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines() == [f"wrote {tmp_path / 't.html'}", f"wrote {tmp_path / 't.png'}"]
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG" and "<svg" in (tmp_path / "t.html").read_text()
    write_turn(tmp_path / "old", proposed=False)
    done = voice(tmp_path, "show", "1", "--db", str(tmp_path / "old" / "events.db"), "--png", str(tmp_path / "o.png"))
    assert done.returncode == 0
    assert any(line.startswith("not in the log: word play times") for line in done.stderr.splitlines()), done.stderr


def test_voice_show_bad_input_is_one_line(tmp_path):
    from show_log import write_turn

    write_turn(tmp_path / "log")
    db = str(tmp_path / "log" / "events.db")
    for args, line in (
        (("show", "7", "--db", db, "--out", str(tmp_path / "x.html")), f"voice: error: no turn 7 in {db}"),
        (("show", "1", "--db", db), "voice: error: voice show needs --out FILE.html or --png FILE.png (or both)"),
        (("show", "1", "--db", db, "--out", str(tmp_path / "nowhere" / "x.html")),
         f"voice: error: cannot write {tmp_path / 'nowhere' / 'x.html'}: No such file or directory"),
    ):
        done = voice(tmp_path, *args)
        assert (done.returncode, done.stderr.strip()) == (2, line)
