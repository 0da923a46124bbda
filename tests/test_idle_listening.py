"""A listener that does only what the moment needs (issue #17): echo
cancellation runs only while there is echo to cancel (voice.audio.echo). What
it saves is measured in benchmarks/live.py (--idle-only); here: that it runs
whenever it is needed, and passes the mic through untouched when it rests."""

from __future__ import annotations

import numpy as np
import pytest

RATE = 16000
BLOCK = 320


@pytest.fixture
def canceller():
    from voice.audio.echo import EchoCanceller, EchoUnavailable

    try:
        return EchoCanceller()
    except EchoUnavailable as exc:
        pytest.skip(str(exc))


def test_echo_cancellation_rests_when_nothing_plays_and_passes_the_mic_through_untouched(canceller):
    from voice.audio.echo import TAIL_S

    rng = np.random.default_rng(5)
    mic = [(rng.standard_normal(BLOCK) * 300).astype(np.int16).tobytes() for _ in range(int(TAIL_S * 50) + 20)]
    out = [canceller.process(m, bytes(BLOCK * 2), busy=False) for m in mic]
    assert not canceller.running
    assert b"".join(out[-10:]) == b"".join(mic[-10:])  # nothing to cancel: exactly the mic
    canceller.process(mic[0], bytes(BLOCK * 2), busy=True)  # a turn began: the reply may play any moment
    assert canceller.running


def test_echo_cancellation_runs_while_the_speaker_plays_and_for_its_echo_after(canceller):
    from voice.audio.echo import TAIL_S

    loud = (np.sin(np.arange(BLOCK) / 3) * 8000).astype(np.int16).tobytes()
    quiet = bytes(BLOCK * 2)
    for _ in range(100):
        canceller.process(quiet, loud, busy=False)  # a notice playing while no turn runs
        assert canceller.running
    for _ in range(int(TAIL_S * 50) - 2):
        canceller.process(quiet, quiet, busy=False)
        assert canceller.running  # the room's echo of what just played
    for _ in range(5):
        canceller.process(quiet, quiet, busy=False)
    assert not canceller.running
