"""Issue #36, point 4, on the tests' private PipeWire: the computer sleeps
under a running `voice run` on the sound card (simulated: the process is
frozen, SIGSTOP, while VOICE_TEST_SLEEP_FILE moves its wall and boot-time
clocks on by 30 s and not its monotonic one; voice.audio.clock).

What the person relies on, checked from the outside:

- at resume the sound card's streams are reopened at once (`audio/lost`
  saying the computer slept, then `audio/back`);
- a timer that came due asleep rings once, saying how late, and is heard
  on the speaker (the reopening does not drop it);
- the next spoken request is heard and answered on the reopened streams.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from heard import common_in_order, heard_words, whisper, words
from voice.log import events as ev

from .audio_server import AudioServer
from .conversation import AUDIO, ROOT, SECOND, LiveDaemon, write_wav

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SCRIPT = f"""
[[reply]]
chunk_delay_ms = 30
tool_calls = [{{ name = "set_timer", arguments = {{ seconds = 20 }} }}]
text_after_tools = "Done, your twenty second timer is set."

[[reply]]
chunk_delay_ms = 40
text = "{SECOND}"
"""


def test_after_a_sleep_the_streams_reopen_and_the_timer_that_came_due_is_heard(audio: AudioServer, tmp_path,
                                                                                monkeypatch):
    whisper()  # the independent transcriber, loaded before the conversation
    slept = tmp_path / "slept"
    monkeypatch.setenv("VOICE_TEST_SLEEP_FILE", str(slept))
    script = tmp_path / "replies.toml"
    script.write_text(SCRIPT)
    daemon = LiveDaemon(tmp_path, audio, script)
    speaker = None
    try:
        daemon.wait_listening()
        said = subprocess.run([sys.executable, "-m", "voice", "ctl", "say", "set a timer for twenty seconds"],
                              cwd=ROOT, env=daemon.env, capture_output=True, text=True, timeout=60)
        assert said.returncode == 0, said.stderr
        speaker = audio.record("speaker.monitor")
        daemon.proc.send_signal(signal.SIGSTOP)
        slept.write_text("30")
        time.sleep(0.3)
        daemon.proc.send_signal(signal.SIGCONT)
        daemon.wait(lambda: any("audio is back" in line for line in daemon.out), 15,
                    "the streams reopened after the resume")
        daemon.wait(lambda: any(line.startswith("notice: Your twenty second timer") for line in daemon.out), 15,
                    "the timer that came due asleep")
        time.sleep(6.0)  # (its words on the speaker: some 4 s)
        speaker.stop()
        replies = len(daemon.replies())
        audio.play(AUDIO / "what_time.wav")
        daemon.wait(lambda: len(daemon.replies()) > replies, 40, "the answer to a request after the resume")
    finally:
        if speaker is not None:
            speaker.stop()
        rc = daemon.stop()
        (tmp_path / "daemon.log").write_text(daemon.log())
        if speaker is not None:
            write_wav(tmp_path / "speaker.wav", speaker.samples())
    log = daemon.log()
    assert rc == 0, log
    events = daemon.events()
    (resumed,) = [e for e in events if e.type == ev.SYSTEM_RESUMED]
    (lost,) = [e for e in events if e.type == ev.AUDIO_LOST]
    (back,) = [e for e in events if e.type == ev.AUDIO_BACK]
    (fired,) = [e for e in events if e.type == ev.TIMER_FIRED]
    assert 29 <= resumed.body.asleep_s <= 31, resumed
    assert lost.body.reason == "the computer slept for thirty seconds" and lost.seq > resumed.seq, lost
    assert back.seq > lost.seq and back.body.after_s < 5.0, back
    assert fired.body.late and fired.body.text.endswith("while the computer was asleep."), fired
    assert fired.at_mono - resumed.at_mono < 5.0, "the timer rang at resume, not at its monotonic due time"
    heard = heard_words(speaker.samples())
    said_words = words(fired.body.text)
    assert common_in_order(heard, said_words) >= 0.6 * len(said_words), f"the timer was not heard: {heard}"
    assert daemon.replies()[-1] == f"assistant: {SECOND}", log
    print(f"live sleep: audio back {back.body.after_s:.2f} s after the resume was noticed; the timer rang "
          f"{fired.at_mono - resumed.at_mono:.2f} s after it; heard: {' '.join(heard)}")
