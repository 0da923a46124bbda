"""Issue #36: the audio server dies in the middle of a reply and comes back
3 s later, under a running `voice run` (the private PipeWire of
tests/live/audio_server.py: pipewire, wireplumber and pipewire-pulse are
killed, then started again on the same runtime directory).

What the person relies on, checked from the outside:

- the service hears again: the next spoken request is answered, on the
  speaker of the server that came back;
- the reply the loss cut is recorded as heard: the turn ends `interrupted`
  (reason audio_lost; no `user/stop`, no new turn) and its delivered words
  are within one of what `speaker.monitor` recorded before the server died
  (an independent transcriber listens);
- the log says `audio/lost` and `audio/back`; the transcript has a notice;
  while the server is away `voice ctl status` says `audio: lost N s ago,
  retrying (…)`.

Its own module: the audio server it kills is the module's.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from heard import common_in_order, heard_words, whisper, words
from voice.log import events as ev
from voice.log.projections import turn_reply
from voice.log.store import EventStore

from .audio_server import AudioServer
from .conversation import AUDIO, FIRST, ROOT, SECOND, LiveDaemon, first_loud, write_wav

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

KILL_AFTER_S = 2.5  # after the reply's first sample reached the speaker: inside its first sentence
DOWN_S = 3.0  # the server is away this long
BACK_WITHIN_S = 15.0  # from the server's return to the service hearing again (back-off at most 5 s)


class Systemd:
    """The notification socket systemd gives a unit: every message, stamped on arrival."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="voice-notify-")) / "notify"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._done.is_set():
            try:
                self.messages.append((time.monotonic(), self.sock.recv(4096).decode()))
            except TimeoutError:
                continue

    def close(self) -> None:
        self._done.set()
        self._thread.join(5)
        self.sock.close()
        shutil.rmtree(self.path.parent, ignore_errors=True)


def test_the_audio_server_dies_mid_reply_and_comes_back(audio: AudioServer, tmp_path, monkeypatch):
    whisper()  # the independent transcriber, loaded before the conversation
    speaker = audio.record("speaker.monitor")
    systemd = Systemd()
    # as under systemd with WatchdogSec=1: WATCHDOG=1 every 0.5 s while the service makes progress
    monkeypatch.setenv("NOTIFY_SOCKET", str(systemd.path))
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    daemon = LiveDaemon(tmp_path, audio)
    after = None
    try:
        daemon.wait_listening()
        time.sleep(0.3)
        audio.play(AUDIO / "three_points.wav")
        daemon.wait(lambda: first_loud(speaker.samples()) is not None, 30, "the reply on the speaker")
        reply_start = first_loud(speaker.samples())
        time.sleep(max(0.0, speaker.time_of(reply_start) + KILL_AFTER_S - time.monotonic()))
        audio.kill_server()
        killed_at = time.monotonic()
        speaker.stop()  # (parecord ended with the server: what it recorded is what played)
        before = speaker.samples()
        time.sleep(DOWN_S / 2)
        status = subprocess.run([sys.executable, "-m", "voice", "ctl", "status"], cwd=ROOT, env=daemon.env,
                                capture_output=True, text=True, timeout=30)
        time.sleep(max(0.0, killed_at + DOWN_S - time.monotonic()))
        audio.restart_server()
        back_at = time.monotonic()
        after = audio.record("speaker.monitor")
        daemon.wait(lambda: any("audio is back" in line for line in daemon.out), BACK_WITHIN_S,
                    "the service to hear again after the audio server came back")
        time.sleep(0.5)
        replies = len(daemon.replies())
        audio.play(AUDIO / "what_time.wav")
        daemon.wait(lambda: len(daemon.replies()) > replies, 40, "the answer to the request after the server's return")
        time.sleep(0.5)
    finally:
        systemd.close()
        speaker.stop()
        if after is not None:
            after.stop()
        rc = daemon.stop()
        (tmp_path / "daemon.log").write_text(daemon.log())
        write_wav(tmp_path / "speaker_before.wav", speaker.samples())
        if after is not None:
            write_wav(tmp_path / "speaker_after.wav", after.samples())
    log = daemon.log()
    assert rc == 0, log
    assert status.returncode == 0, status.stderr
    assert re.search(r"^audio: lost \d+ s ago, retrying \(.+\)$", status.stdout, re.M), status.stdout
    assert re.search(r"^state: waiting for audio", status.stdout, re.M), status.stdout  # (it said "listening")
    # PortAudio's ALSA thread printed some 380,000 lines a second to C's stderr while the server was
    # dead (50-70 MB into the journal a loss, found by a tester): none of it reaches the service's stderr
    flood = [line for line in daemon.err if "pa_linux_alsa.c" in line or line.startswith("Expression '")]
    assert len(flood) <= 3, f"{len(flood)} lines of PortAudio's messages on stderr, e.g. {flood[:2]}"

    # -- the log ---------------------------------------------------------------------------
    events = daemon.events()
    turns = [e.turn for e in events if e.type == ev.TURN_START]
    assert len(turns) == 2, log
    (lost,) = [e for e in events if e.type == ev.AUDIO_LOST]
    (back,) = [e for e in events if e.type == ev.AUDIO_BACK]
    assert lost.turn == turns[0], lost
    assert lost.at_mono - killed_at < 1.0, f"the loss was known {lost.at_mono - killed_at:.2f} s after the kill"
    # (after_s counts from the loss as known, up to a second after the kill)
    assert back.at_mono - back_at < BACK_WITHIN_S and back.body.after_s > DOWN_S - 1.0, back
    assert not [e for e in events if e.type == ev.USER_STOP], log
    (cut_end,) = [e for e in events if e.type == ev.TURN_END and e.turn == turns[0]]
    assert cut_end.body.outcome == ev.INTERRUPTED and cut_end.body.reason == ev.AUDIO_LOST_REASON, cut_end
    store = EventStore(daemon.db)
    try:
        cut, answered = (turn_reply(store, events[0].conversation, t) for t in turns)
    finally:
        store.close()
    assert cut.interrupted and cut.delivered_text and FIRST.startswith(cut.delivered_text), cut
    assert len(words(cut.delivered_text)) < len(words(FIRST)) / 2, cut  # not "played to the end"
    assert answered.outcome == ev.COMPLETED and answered.delivered_text == SECOND, answered
    assert any(line.startswith("notice: the audio device was lost") for line in daemon.out), log
    # alive and trying to reopen the device is not hung: the watchdog is fed while the server is away
    fed = [t for t, m in systemd.messages if m == "WATCHDOG=1" and lost.at_mono + 0.5 < t < back_at]
    assert fed, f"no WATCHDOG=1 while the device was lost: {systemd.messages}"

    # -- what the speaker played before the server died, heard by an independent listener ---------
    heard = heard_words(before[reply_start:])
    delivered = words(cut.delivered_text)
    assert heard[:2] == words(FIRST)[:2], f"the reply was not heard on the speaker: {heard}"
    assert abs(len(heard) - len(delivered)) <= 1, f"the speaker played {heard} but the log delivered {delivered}"
    assert common_in_order(heard, delivered) >= len(delivered) - 1, f"heard {heard}, delivered {delivered}"
    # -- and the answer on the speaker of the server that came back -----------------------------
    second = words(SECOND)
    heard_after = heard_words(after.samples())
    assert common_in_order(heard_after, second) >= 0.75 * len(second), f"the answer was not heard: {heard_after}"
    print(f"live audio loss: known {(lost.at_mono - killed_at) * 1000:.0f} ms after the kill; back "
          f"{back.at_mono - back_at:.2f} s after the server's return ({back.body.attempts} tries); delivered "
          f"{len(delivered)} words, the speaker played {len(heard)}: {' '.join(heard)}")


def test_started_before_the_audio_server_it_waits_and_listens_once_the_server_comes(audio: AudioServer, tmp_path):
    """#36.5: `voice run` started before the audio server (systemd at login,
    a socket-activated PipeWire) waits for it, says so once, keeps its
    control socket answering, answers a request typed meanwhile in writing
    at once (`ctl say` waited for ever), and listens within 2 s of the
    server's arrival (5 s later here); the first spoken request is then
    answered."""
    audio.kill_server()
    daemon = None
    try:
        daemon = LiveDaemon(tmp_path, audio)
        daemon.wait(lambda: any(line.startswith("waiting for a sound device") for line in daemon.err), 90,
                    "the daemon to say that it waits for a sound device")
        waiting_seen = time.monotonic()
        status = subprocess.run([sys.executable, "-m", "voice", "ctl", "status"], cwd=ROOT, env=daemon.env,
                                capture_output=True, text=True, timeout=30)
        assert status.returncode == 0, status.stderr
        assert re.search(r"^audio: waiting for a sound device for \d+ s, retrying \(.+\)$", status.stdout,
                         re.M), status.stdout
        assert not any(line.startswith("listening") for line in daemon.err), daemon.log()
        # A request typed meanwhile is answered in writing at once (it waited for a speaker that was never there).
        typed = subprocess.run([sys.executable, "-m", "voice", "ctl", "say", "what time is it"], cwd=ROOT,
                               env=daemon.env, capture_output=True, text=True, timeout=30)
        assert typed.returncode == 0 and typed.stdout.startswith("assistant (not said aloud): "), \
            (typed.stdout, typed.stderr)
        answers = len(daemon.replies())
        time.sleep(max(0.0, waiting_seen + 5.0 - time.monotonic()))
        audio.restart_server()
        back_at = time.monotonic()
        daemon.wait(lambda: any(line.startswith("listening") for line in daemon.err), 30,
                    "the daemon to listen once the audio server is there")
        listening_after = time.monotonic() - back_at
        speaker = audio.record("speaker.monitor")
        time.sleep(0.3)
        audio.play(AUDIO / "three_points.wav")
        daemon.wait(lambda: len(daemon.replies()) > answers, 40, "the answer to the first spoken request")
        daemon.wait(lambda: first_loud(speaker.samples()) is not None, 30, "the answer on the speaker")
        speaker.stop()
    finally:
        rc = daemon.stop() if daemon is not None else None
        if not (audio.run_dir / "pipewire-0").is_socket():
            audio.restart_server()  # the module's server, for the tests after this one
    log = daemon.log()
    assert rc == 0, log
    waits = [line for line in daemon.err if line.startswith("waiting for a sound device")]
    assert len(waits) == 1, log  # said once, not at every try
    assert listening_after < 2.0, f"listening {listening_after:.2f} s after the audio server was there"
    notices = [line for line in daemon.out if line.startswith("notice: waiting for a sound device")]
    assert len(notices) == 1, log
    events = daemon.events()
    (lost,) = [e for e in events if e.type == ev.AUDIO_LOST]
    (back,) = [e for e in events if e.type == ev.AUDIO_BACK]
    assert "no sound device yet" in lost.body.reason and back.body.after_s > 4.0, (lost, back)
    print(f"started without audio: listening {listening_after:.2f} s after the server was there "
          f"({back.body.attempts} tries)")


def test_an_audio_server_stopped_for_5_s_and_continued_is_heard_again(audio: AudioServer, tmp_path):
    """#36 (d): the audio server hangs (SIGSTOP) for 5 s and goes on: the
    loss is known, `voice ctl status` answers meanwhile, and the next
    request is heard and answered."""
    daemon = LiveDaemon(tmp_path, audio)
    frozen = False
    try:
        daemon.wait_listening()
        time.sleep(1.0)
        audio.freeze_server(True)
        frozen, stopped_at = True, time.monotonic()
        daemon.wait(lambda: any(line.startswith("notice: the audio device was lost") for line in daemon.out), 5,
                    "the loss to be known while the server is stopped")
        known_after = time.monotonic() - stopped_at
        status = subprocess.run([sys.executable, "-m", "voice", "ctl", "status"], cwd=ROOT, env=daemon.env,
                                capture_output=True, text=True, timeout=10)
        time.sleep(max(0.0, stopped_at + 5.0 - time.monotonic()))
        audio.freeze_server(False)
        frozen, continued_at = False, time.monotonic()
        daemon.wait(lambda: any("audio is back" in line for line in daemon.out), BACK_WITHIN_S,
                    "the service to hear again after the server went on")
        back_after = time.monotonic() - continued_at
        time.sleep(0.5)
        audio.play(AUDIO / "what_time.wav")
        daemon.wait(lambda: daemon.replies(), 40, "the answer to the request after the server went on")
    finally:
        if frozen:
            audio.freeze_server(False)
        rc = daemon.stop()
    log = daemon.log()
    assert rc == 0, log
    assert status.returncode == 0 and re.search(r"^audio: lost \d+ s ago, retrying", status.stdout, re.M), (
        status.stdout, status.stderr)
    events = daemon.events()
    assert len([e for e in events if e.type == ev.AUDIO_LOST]) == 1, log
    assert len([e for e in events if e.type == ev.AUDIO_BACK]) == 1, log
    assert len([e for e in events if e.type == ev.TURN_START]) == 1, log
    print(f"audio server stopped 5 s: the loss known {known_after:.2f} s after the stop, audio back "
          f"{back_after:.2f} s after it went on")


LOSSES = 3  # mid-reply kills in a row: PortAudio 19.6 left a stuck stream after 6 of 9 such losses


def threads_and_fds(pid: int) -> tuple[list[int], int]:
    """The native ids of a process's threads, and how many files it has open."""
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")], len(os.listdir(f"/proc/{pid}/fd"))


def idle_priority_threads(pid: int, tids: list[int]) -> list[int]:
    found = []
    for tid in tids:
        try:
            if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                found.append(tid)
        except OSError:  # it has ended meanwhile
            pass
    return found


def test_losses_mid_reply_leave_no_thread_or_file_behind(audio: AudioServer, tmp_path):
    """#36: the audio server killed in the middle of a reply, three times,
    under one `voice run`: each time PortAudio 19.6 may leave the dead
    stream's thread looping (PortAudio #1037). Once the service hears again,
    its threads and open files are as many as before the losses (each stuck
    stream kept 6 threads and some 35 files, its thread spinning at idle
    priority, until the service was restarted)."""
    script = tmp_path / "replies.toml"
    script.write_text(f'[[reply]]\nchunk_delay_ms = 40\ntext = "{FIRST}"\n\n' * (LOSSES + 2))
    daemon = LiveDaemon(tmp_path / "daemon", audio, script)
    pid = daemon.proc.pid
    speaker = audio.record("speaker.monitor")
    try:
        daemon.wait_listening()
        time.sleep(0.3)
        audio.play(AUDIO / "what_time.wav")
        daemon.wait(lambda: first_loud(speaker.samples()) is not None, 40, "the first answer on the speaker")
        daemon.wait(lambda: len(daemon.replies()) == 1, 40, "the first answer")
        time.sleep(1.0)
        before = threads_and_fds(pid)
        for n in range(1, LOSSES + 1):
            start = speaker.index_at(time.monotonic())
            audio.play(AUDIO / "three_points.wav")
            daemon.wait(lambda: first_loud(speaker.samples(), start) is not None, 40, f"reply {n} on the speaker")
            time.sleep(1.0)
            audio.kill_server()
            speaker.stop()
            time.sleep(1.0)
            audio.restart_server()
            speaker = audio.record("speaker.monitor")
            daemon.wait(lambda: sum("audio is back" in line for line in daemon.out) == n, BACK_WITHIN_S,
                        f"the service to hear again after loss {n}")
            # (the reopened streams may open before the server has its default devices: it moves them there)
            daemon.wait(lambda: "mic" in audio.connections()[1], 10, f"the reopened mic on `mic` after loss {n}")
            time.sleep(0.5)
        answers = len(daemon.replies())
        audio.play(AUDIO / "what_time.wav")
        daemon.wait(lambda: len(daemon.replies()) > answers, 40, "the answer after the last loss")
        time.sleep(2.0)
        after = threads_and_fds(pid)
        idle = idle_priority_threads(pid, after[0])
    finally:
        speaker.stop()
        rc = daemon.stop()
    log = daemon.log()
    print(f"{LOSSES} losses mid-reply: threads {len(before[0])} -> {len(after[0])}, open files {before[1]} -> {after[1]}; "
          f"{sum('stuck PortAudio threads' in line for line in daemon.err)} losses with stuck threads cancelled")
    assert rc == 0, log
    assert len(after[0]) <= len(before[0]) + 2, f"threads: {len(before[0])} before the losses, {len(after[0])} after"
    assert after[1] <= before[1] + 6, f"open files: {before[1]} before the losses, {after[1]} after"
    assert not idle, f"threads left at idle priority (a stuck stream's): {idle}"
    assert not any("cannot be closed" in line for line in daemon.err), log
