"""Issue #36 (b) and (c): the microphone and speaker change
under a running `voice run`, on the tests' private PipeWire
(tests/live/audio_server.py), and the person is still heard and answered.

- (b) the system's default source and sink switched to a second pair (a
  headset chosen in the desktop's sound settings) between two requests: the
  next request is heard from the new microphone and answered on the new
  speaker, and nothing more plays on the old one;
- (c) the microphone's source removed and added again (the only microphone,
  a USB one, unplugged and plugged back in): once it is back the next
  request is answered.

(b) and (c) are the audio server's work: the service opens ALSA's `default`
(PipeWire's ALSA plugin), and WirePlumber moves such a stream when the
default changes or its device goes, with no gap the service could see (0.2
s from `pactl set-default-*` to the streams on the new pair).

Its own module: the devices it adds and removes are the module's server's.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .audio_server import AudioServer
from .conversation import AUDIO, LiveDaemon, first_loud

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SCRIPT = """
[[reply]]
text = "It is noon."

[[reply]]
text = "It is one minute past noon."

[[reply]]
text = "It is two minutes past noon."
"""


def script(tmp: Path) -> Path:
    path = tmp / "replies.toml"
    path.write_text(SCRIPT)
    return path


def answered(audio: AudioServer, daemon: LiveDaemon, feed: str, timeout: float = 40) -> None:
    """A request spoken into `feed` (what the mic behind it hears) is
    answered (the transcript's line comes once it has played out)."""
    time.sleep(0.3)
    replies = len(daemon.replies())
    player = audio.play(AUDIO / "what_time.wav", device=feed)
    daemon.wait(lambda: len(daemon.replies()) > replies, timeout, f"the answer to the request spoken into {feed}")
    assert player.wait(5) == 0, player.stderr.read()
    time.sleep(0.5)  # a margin of silence after it


def seconds_until(daemon: LiveDaemon, condition, what: str, since: float, timeout: float = 10) -> float:
    daemon.wait(condition, timeout, what)
    return time.monotonic() - since


def on(audio: AudioServer, speaker: str, mic: str) -> bool:
    """The service's streams play to `speaker` and record from `mic` (the
    test's own recorders record monitors only)."""
    played, recorded = audio.connections()
    return played == [speaker] and mic in recorded


def test_default_devices_switched_mid_conversation_are_followed(audio: AudioServer, tmp_path):
    """(b): the default sink and source switched to a second pair between two
    requests: the second is heard from the new mic, answered on the new speaker."""
    pair = audio.add_pair("2")
    old_speaker, new_speaker = audio.record("speaker.monitor"), audio.record("speaker2.monitor")
    daemon = LiveDaemon(tmp_path, audio, script(tmp_path))
    try:
        daemon.wait_listening()
        answered(audio, daemon, "micfeed")
        assert first_loud(old_speaker.samples()) is not None, "the first answer was not played on the speaker"
        old_end, switched_at = len(old_speaker), time.monotonic()
        audio.set_defaults("speaker2", "mic2")
        moved_after = seconds_until(daemon, lambda: on(audio, "speaker2", "mic2"), "the streams on the new pair",
                                    switched_at)
        answered(audio, daemon, "micfeed2")
    finally:
        old_speaker.stop()
        new_speaker.stop()
        rc = daemon.stop()
        audio.set_defaults("speaker", "mic")
        audio.remove_modules(pair)
    log = daemon.log()
    assert rc == 0, log
    assert len(daemon.replies()) == 2, log
    assert first_loud(new_speaker.samples()) is not None, "the second answer was not played on the new speaker"
    assert first_loud(old_speaker.samples(), old_end) is None, "the second answer was played on the old speaker"
    print(f"default devices switched: the service's streams on the new devices {moved_after:.2f} s after the switch")


def test_the_microphone_removed_and_added_again_is_heard_again(audio: AudioServer, tmp_path):
    """(c): the microphone's source goes (a USB microphone unplugged, the only
    one) and comes back 3 s later: once it is back, the next request is heard
    and answered, by the same process. (Meanwhile PipeWire moves the capture
    to the speaker's monitor, the default source it falls back to: the
    service cannot tell that from ALSA's `default`.)"""
    speaker = audio.record("speaker.monitor")
    daemon = LiveDaemon(tmp_path, audio, script(tmp_path))
    try:
        daemon.wait_listening()
        time.sleep(0.5)
        audio.remove_modules([audio.mic_module])
        time.sleep(3.0)
        added_at = time.monotonic()
        audio.mic_module = audio.add_mic()
        audio.set_defaults("speaker", "mic")
        back_after = seconds_until(daemon, lambda: on(audio, "speaker", "mic"), "the capture on the mic", added_at)
        answered(audio, daemon, "micfeed")
    finally:
        speaker.stop()
        rc = daemon.stop()
    log = daemon.log()
    assert rc == 0, log
    assert first_loud(speaker.samples()) is not None, "the answer was not played on the speaker"
    print(f"microphone removed for 3 s: the service's capture on it again {back_after:.2f} s after it came back")
