"""Keeping the session's sound (voice.audio.recording) and saving it with a
scenario that replays (voice.service.recording): the ring's memory bound,
the files' modes, and what the scenario is built of, from a real log."""

from __future__ import annotations

import json
import stat
import tomllib
import wave
from pathlib import Path

import numpy as np
import pytest

from show_log import CONVERSATION, REPLY_0, REPLY_1, write_turn
from voice.settings import Settings
from voice.audio.recording import Recorder
from voice.config import load_config_with_sources
from voice.log import events as ev
from voice.log.store import EventStore
from voice.service.recording import config_toml, save_session
from voice.service.scenario import load_scenario

BLOCK = 320  # 20 ms at 16 kHz


def blocks(seconds: float, start: int = 0):
    """(mic, played) blocks whose samples count up, so a test can tell which were kept."""
    for k in range(int(seconds * 50)):
        n = start + k
        yield np.full(BLOCK, n % 30000, np.int16).tobytes(), np.full(BLOCK, -(n % 30000), np.int16).tobytes()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def wav(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), np.int16)


def test_the_ring_keeps_the_last_seconds_and_no_more(tmp_path):
    ring = Recorder.ring(60.0)
    for mic, played in blocks(200.0):
        ring.add(mic, played)
    kept = {t: sum(len(b) for b in ring._blocks[t]) for t in ("mic", "played")}
    assert kept == {"mic": 60 * 16000, "played": 60 * 16000}  # 1.9 MB a minute per stream, no more
    assert ring.starts() == {"mic": 140 * 16000, "played": 140 * 16000}
    info = ring.save(tmp_path / "saved")
    mic = wav(tmp_path / "saved" / "mic.wav")
    assert len(mic) == 60 * 16000 and mic[0] == 140 * 50 and mic[-1] == 200 * 50 - 1  # the last minute, in order
    assert info == json.loads((tmp_path / "saved" / "recording.json").read_text()) == {
        "rate": 16000, "mic_start": 140 * 16000, "played_start": 140 * 16000}
    assert Recorder.ring(0) is None  # 0: off


def test_saved_files_are_the_users_alone_and_never_mixed(tmp_path):
    ring = Recorder.ring(5.0)
    for mic, played in blocks(1.0):
        ring.add(mic, played)
    out = tmp_path / "bug"
    ring.save(out)
    assert mode(out) == 0o700
    assert {p.name: mode(p) for p in out.iterdir()} == {"mic.wav": 0o600, "played.wav": 0o600,
                                                        "mic_blocks.txt": 0o600, "recording.json": 0o600}
    with pytest.raises(ValueError, match="is not empty: give a new directory"):
        ring.save(out)
    with pytest.raises(ValueError, match="is a file"):
        ring.save(out / "mic.wav")
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    ring.save(empty)
    assert mode(empty) == 0o700


def test_recording_to_a_directory_is_readable_while_it_runs(tmp_path):
    """`--record`: written as it comes, so a killed service leaves playable files."""
    rec = Recorder.to_directory(tmp_path / "rec")
    for mic, played in blocks(2.0):
        rec.add(mic, played)
    assert len(wav(tmp_path / "rec" / "mic.wav")) == 2 * 16000  # before any close
    assert (tmp_path / "rec" / "mic_blocks.txt").read_text() == f"{BLOCK}\n" * 100
    assert mode(tmp_path / "rec" / "played.wav") == 0o600
    rec.save(tmp_path / "rec")
    assert wav(tmp_path / "rec" / "played.wav")[-1] == -99
    with pytest.raises(ValueError, match="not empty"):
        Recorder.to_directory(tmp_path / "rec")


def test_a_saved_session_is_a_scenario_of_its_recorded_replies_and_tools(tmp_path):
    """From a real log (tests/show_log.py: a voice turn with a write tool,
    cut by a barge-in): one track, the model's two requests with their text,
    tool call and timing, and a stand-in that answers as the tool did."""
    write_turn(tmp_path / "log")
    store = EventStore(tmp_path / "log" / "events.db")
    ring = Recorder.ring(120.0)
    for mic, played in blocks(12.0):
        ring.add(mic, played)
    config, _ = load_config_with_sources(None)
    try:
        saved = save_session(tmp_path / "saved", ring, store, Settings.from_config(config), since_seq=0)
    finally:
        store.close()
    out = tmp_path / "saved"
    assert saved["turns"] == [1] and saved["seconds"] == 12.0
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "events.db", "mic.wav", "mic_blocks.txt",
                                                     "played.wav", "recording.json", "scenario.toml"]
    assert all(mode(p) == 0o600 for p in out.iterdir())
    copy = EventStore(out / "events.db")
    try:
        assert [(e.type, e.payload) for e in copy.events()] == [
            (e.type, e.payload) for e in EventStore(tmp_path / "log" / "events.db").events(CONVERSATION)]
    finally:
        copy.close()

    scenario = load_scenario(out / "scenario.toml")
    (track,) = scenario.users
    assert (track.name, track.when, track.seconds, len(track.audio)) == ("mic.wav", "at", 0.0, 12 * 16000)
    assert scenario.blocks == (BLOCK,) * 600 and scenario.timing == "recorded"  # the device's blocks, again
    assert scenario.echo is None  # the recording holds the room's own echo
    first, second = scenario.replies
    assert first.text == REPLY_0 and [(c.name, c.arguments) for c in first.tool_calls] == [
        ("add_note", {"text": "the sea"})]
    assert second.text == REPLY_1 and not second.tool_calls
    assert (first.message, second.message) == ("1.0.0", "1.1.0")  # the requests they answer, as [[play]] names them
    # due when the first delta came: 150 ms after the stream began, 3.45 s on a clock anchored at 3.4 s
    assert (first.at_s, second.at_s) == (pytest.approx(3.6), pytest.approx(4.35))
    assert first.chunk_delay_ms == 40.0 and first.first_delay_ms == 0.0
    # each sentence is held until where it began playing (speech/sentence), on the track's clock
    assert scenario.plays == (("1.0.0", 0, 4.0), ("1.1.0", 0, 5.5), ("1.1.0", 1, 7.0), ("1.1.0", 2, 8.5))
    (tool,) = scenario.tools
    assert (tool.name, tool.effect, tool.receipt, tool.result) == ("add_note", "write", "confirmed", "noted")
    assert tool.wait_s == pytest.approx(0.2)
    assert tomllib.loads((out / "config.toml").read_text())["barge_in"] == config["barge_in"]


def test_a_ring_that_begins_mid_session_keeps_the_listen_gates_state(tmp_path):
    """In wake mode a ring saved long into a session begins where the listen
    gate already holds a state: the conversation window the assistant's last
    reply opened, a wake word not yet used. The scenario carries both, before
    its start, so that a follow-up the session answered is answered again."""
    rate = 16000
    config, _ = load_config_with_sources(None)  # the default: wake mode, an 8 s window
    assert config["listen"]["mode"] == "wake"

    def saved(name: str, rows: list) -> tuple[float | None, float | None]:
        store = EventStore(tmp_path / name / "events.db")
        for body in rows:
            store.record("c1", body)
        ring = Recorder.ring(4.0)
        for mic, played in blocks(14.0):  # the ring keeps 10 s to 14 s
            ring.add(mic, played)
        try:
            info = save_session(tmp_path / f"{name}-saved", ring, store, Settings.from_config(config), since_seq=0)
        finally:
            store.close()
        assert info["mic_start"] == 10 * rate
        scenario = load_scenario(tmp_path / f"{name}-saved" / "scenario.toml")
        return scenario.wake_word_at, scenario.assistant_stopped_at

    def wake(s: float):
        return ev.ListenWake(position=int(s * rate), model="okay_nabu")

    def speech(start: float, end: float, for_assistant: bool):
        return ev.ListenSpeech(start=int(start * rate), end=int(end * rate), decided=int(end * rate) + 8000,
                               for_assistant=for_assistant)

    # a wake word used by the request after it, the reply's end at 7 s, a wake word at 9 s not yet used
    assert saved("open", [wake(5), speech(5.2, 6, True), ev.ListenWindow(position=7 * rate), wake(9),
                          ev.ListenWindow(position=11 * rate)]) == (-1.0, -3.0)  # (the one at 11 s is replayed)
    # the window closed (9 s before the start), the wake word used: the gate starts as a fresh one does
    assert saved("closed", [ev.ListenWindow(position=1 * rate), wake(5), speech(5.2, 6, True)]) == (None, None)
    # speech the gate ignored does not use the wake word up
    assert saved("ignored", [speech(8, 8.5, False), wake(9), speech(9.1, 9.2, False)]) == (-1.0, None)


def test_the_config_written_beside_it_is_a_valid_config(tmp_path):
    config, _ = load_config_with_sources(None)
    path = tmp_path / "config.toml"
    path.write_text(config_toml(Settings.from_config(config)))
    again, sources = load_config_with_sources(str(path))
    assert again == config
    assert {k.split(".")[0] for k, v in sources.items() if v != "default"} >= {"vad", "barge_in", "listen"}
