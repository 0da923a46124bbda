"""The microphone reaches the service whole while another program records
the speaker at a low latency (a level meter, a call, a screen recorder).

PipeWire then runs the speaker's graph at a small quantum (10 ms here) and
the microphone's at the service's own: two clocks. PortAudio's duplex
stream on ALSA waits for both sides in one loop, and on two clocks it
filled every other mic block with zeros (flagged `input underflow`): half
of what the person said never reached the listener. Measured before the
fix, on this test: about half the request's loud frames were in the
service's recording of its microphone; the request after a change of
devices was heard as "What's that?", or not at all (the live device tests'
failures, #36). The mic and the speaker are now two streams
(voice.audio.live).

From the outside: `voice run --record` writes the microphone as the
service received it (`mic.wav`); the request played into the virtual
microphone must be in it whole, and answered.
"""

from __future__ import annotations

import time
import wave

import numpy as np
import pytest

from .audio_server import AudioServer
from .conversation import AUDIO, LiveDaemon, loud_frames

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def read_wav(path) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert w.getframerate() == 16000, path
        return np.frombuffer(w.readframes(w.getnframes()), np.int16)


def test_the_mic_reaches_the_service_whole_while_another_program_records_the_speaker(audio: AudioServer, tmp_path):
    meter = audio.record("speaker.monitor")  # another program on the speaker, at 10 ms
    rec = tmp_path / "rec"
    daemon = LiveDaemon(tmp_path / "live", audio, args=("--record", str(rec)))
    try:
        daemon.wait_listening()
        time.sleep(0.5)
        request = AUDIO / "what_time.wav"
        assert audio.play(request).wait(30) == 0
        daemon.wait(lambda: daemon.replies(), 60, "the answer to the request")
        time.sleep(0.5)
    finally:
        meter.stop()
        code = daemon.stop()
    log = daemon.log()
    assert code == 0, log
    assert any(line.startswith("you: What time is it") for line in daemon.out), log

    spoken = int(loud_frames(read_wav(request)).sum())
    received = int(loud_frames(read_wav(rec / "mic.wav")).sum())
    # all of it (a frame or two more where the resampler spreads an edge), not every other block
    assert 0.9 * spoken <= received <= spoken + 5, (received, spoken, log)
    print(f"the request's loud 10 ms frames: {spoken} spoken, {received} in the service's recording of its mic")
