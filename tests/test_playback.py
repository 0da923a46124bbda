"""PlaybackBuffer: the speaker's cursor. `pull(n)` is what the audio callback
calls; `heard`/`handed`/`span`/`finished` say how much of each chunk reached
the device and the person."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from voice.audio.playback import PlaybackBuffer


def ramp(start: int, n: int) -> np.ndarray:
    """n distinct, non-zero int16 samples."""
    return np.arange(start, start + n, dtype=np.int16)


def test_pull_when_empty_gives_silence_and_advances_position():
    buf = PlaybackBuffer(16000)
    assert buf.position == 0
    out = buf.pull(320)
    assert out.dtype == np.int16
    assert out.shape == (320,)
    assert not out.any()
    assert buf.position == 320
    out = buf.pull(7)
    assert out.shape == (7,) and not out.any()
    assert buf.position == 327
    assert buf.starts == []
    assert buf.clears == []
    assert buf.pending() is False


def test_two_chunks_come_out_in_order_across_odd_blocks():
    buf = PlaybackBuffer(16000)
    a, b = ramp(1, 100), ramp(1000, 50)
    buf.enqueue("a", a)
    buf.enqueue("b", b)
    assert buf.pending() is True
    blocks = [buf.pull(n) for n in (33, 33, 33, 33, 33)]  # 165 samples: 150 speech + 15 silence
    out = np.concatenate(blocks)
    expected = np.concatenate([a, b, np.zeros(15, np.int16)])
    np.testing.assert_array_equal(out, expected)
    assert buf.position == 165
    assert buf.starts == [0, 100]
    assert buf.pending() is False
    assert buf.keys() == ["a", "b"]


def test_starts_record_first_sample_position_after_silence():
    buf = PlaybackBuffer(16000)
    buf.pull(50)  # silence first
    buf.enqueue("a", ramp(1, 30))
    buf.pull(20)  # a starts at 50
    buf.enqueue("b", ramp(100, 30))
    buf.pull(17)  # a: 10 more (done at 80), b starts at 80
    buf.pull(100)
    assert buf.starts == [50, 80]
    assert buf.span("a") == (50, 80)
    assert buf.span("b") == (80, 110)


def test_heard_before_during_and_after_a_chunk():
    buf = PlaybackBuffer(16000)
    buf.pull(40)  # position 40 before the chunk is queued
    buf.enqueue("a", ramp(1, 200))
    # Not handed yet: nothing heard, no span.
    assert buf.heard("a") == 0
    assert buf.heard("a", 10) == 0
    assert buf.handed("a") == 0
    assert buf.span("a") is None
    assert buf.finished("a") is False

    buf.pull(120)  # chunk starts at 40, 120 samples handed, position 160
    assert buf.handed("a") == 120
    assert buf.span("a") == (40, 160)
    assert buf.heard("a", 0) == 120
    assert buf.heard("a", 50) == 70  # 160 - 50 - 40
    assert buf.heard("a", 120) == 0  # exactly at the start
    assert buf.heard("a", 500) == 0  # clamped at 0
    assert buf.finished("a") is False

    buf.pull(100)  # 80 more handed (done at 240), 20 silence, position 260
    assert buf.handed("a") == 200
    assert buf.span("a") == (40, 240)
    assert buf.heard("a", 0) == 200  # clamped at taken, not 220
    assert buf.heard("a", 20) == 200  # 260 - 20 - 40 = 200
    assert buf.heard("a", 21) == 199
    assert buf.finished("a", 0) is True
    assert buf.finished("a", 20) is True
    assert buf.finished("a", 21) is False


def test_unknown_key_and_forget():
    buf = PlaybackBuffer(16000)
    assert buf.heard("nope") == 0
    assert buf.handed("nope") == 0
    assert buf.span("nope") is None
    assert buf.finished("nope") is False
    buf.enqueue("a", ramp(1, 10))
    buf.pull(10)
    assert buf.handed("a") == 10
    buf.forget("a")
    assert buf.keys() == []
    assert buf.handed("a") == 0
    assert buf.finished("a") is False


def test_request_clear_waits_for_next_pull_then_silences():
    buf = PlaybackBuffer(16000)
    a, b = ramp(1, 300), ramp(5000, 300)
    buf.enqueue("a", a)
    buf.enqueue("b", b)
    first = buf.pull(100)
    np.testing.assert_array_equal(first, a[:100])

    buf.request_clear()
    # Nothing happens until the callback pulls.
    assert buf.clears == []
    assert buf.pending() is True
    assert buf.handed("a") == 100
    assert buf.position == 100

    out = np.concatenate([buf.pull(128), buf.pull(128), buf.pull(600)])
    assert not out.any(), "a sample of a cleared chunk reached the device"
    assert buf.clears == [100]
    assert buf.pending() is False
    assert buf.position == 956
    # What was handed stays handed; the rest was never handed.
    assert buf.handed("a") == 100
    assert buf.handed("b") == 0
    assert buf.span("a") == (0, 100)
    assert buf.span("b") is None
    assert buf.heard("a", 0) == 100
    assert buf.finished("a") is False
    assert buf.starts == [0]

    # One request clears once.
    buf.pull(10)
    assert buf.clears == [100]


def test_enqueue_after_a_clear_plays_normally():
    buf = PlaybackBuffer(16000)
    buf.enqueue("a", ramp(1, 300))
    buf.pull(50)
    buf.request_clear()
    assert not buf.pull(64).any()
    assert buf.clears == [50]
    c = ramp(2000, 90)
    buf.enqueue("c", c)
    out = np.concatenate([buf.pull(64), buf.pull(64)])
    np.testing.assert_array_equal(out, np.concatenate([c, np.zeros(38, np.int16)]))
    assert buf.starts == [0, 114]
    assert buf.span("c") == (114, 204)
    assert buf.finished("c") is True
    assert buf.handed("a") == 50


@pytest.mark.parametrize(
    "samples",
    [
        np.ones(10, dtype=np.float32),
        np.ones(10, dtype=np.int32),
        np.ones(10, dtype=np.uint16),
        np.ones((10, 1), dtype=np.int16),
        np.ones((2, 10), dtype=np.int16),
    ],
    ids=["float32", "int32", "uint16", "2d-column", "2d-stereo"],
)
def test_enqueue_rejects_non_mono_int16(samples):
    buf = PlaybackBuffer(16000)
    with pytest.raises(ValueError, match="mono int16"):
        buf.enqueue("x", samples)
    assert buf.keys() == []
    assert buf.pending() is False
    assert not buf.pull(10).any()


def test_concurrent_pull_and_enqueue_lose_or_duplicate_nothing():
    buf = PlaybackBuffer(16000)
    rng = np.random.default_rng(1234)
    chunks = []
    value = 1
    for _ in range(200):
        n = int(rng.integers(1, 150))
        chunks.append(np.arange(value, value + n, dtype=np.int16))  # all non-zero, all distinct
        value += n
    assert value < 32767
    total = sum(len(c) for c in chunks)

    blocks: list[np.ndarray] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def callback_thread() -> None:
        try:
            # Keep pulling until every chunk was enqueued and played out, then a bit of silence.
            while not (done.is_set() and not buf.pending()):
                blocks.append(buf.pull(320))
            for _ in range(3):
                blocks.append(buf.pull(320))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=callback_thread, daemon=True)
    t.start()
    for i, c in enumerate(chunks):
        buf.enqueue(i, c)
    done.set()
    t.join(timeout=10)
    assert not t.is_alive(), "the pulling thread did not finish"
    assert not errors

    out = np.concatenate(blocks)
    assert len(out) == 320 * len(blocks) == buf.position
    # Speech, in order, nothing lost or duplicated; silence only between chunks.
    np.testing.assert_array_equal(out[out != 0], np.concatenate(chunks))
    assert len(buf.starts) == 200
    assert buf.starts == sorted(buf.starts)
    covered = np.zeros(len(out), dtype=bool)
    for i, c in enumerate(chunks):
        start, end = buf.span(i)
        assert end - start == len(c)
        np.testing.assert_array_equal(out[start:end], c)
        covered[start:end] = True
        assert buf.handed(i) == len(c)
        assert buf.finished(i)
    assert covered.sum() == total
    assert not out[~covered].any()
    # The tail is silence.
    assert not out[-320:].any()


def test_played_and_dropped_audio_is_released_but_its_record_kept():
    """A service runs for days: a chunk's samples are freed once handed over
    (or dropped), while `heard`/`span` keep working."""
    buf = PlaybackBuffer(16000)
    buf.enqueue("a", np.ones(500, np.int16))
    buf.enqueue("b", np.ones(500, np.int16))
    buf.pull(600)  # all of a, part of b
    buf.request_clear()
    buf.pull(100)
    assert buf._chunks["a"].samples.size == 0 and buf._chunks["b"].samples.size == 0
    assert buf.heard("a") == 500 and buf.handed("b") == 100
    assert buf.span("a") == (0, 500) and buf.finished("a")


def test_a_held_chunk_starts_exactly_at_its_position_and_not_sooner():
    """A replayed recording's reply: silence until `not_before`, mid-block, then the chunk."""
    buf = PlaybackBuffer(16000)
    buf.enqueue("a", ramp(1, 100), not_before=450)
    assert not buf.pull(320).any()
    out = buf.pull(320)
    assert not out[:130].any() and (out[130:230] == ramp(1, 100)).all() and not out[230:].any()
    assert buf.starts == [450] and buf.span("a") == (450, 550)
    buf.enqueue("b", ramp(7, 10), not_before=100)  # a position already past: at once
    assert (buf.pull(10) == ramp(7, 10)).all() and buf.starts[-1] == 640


def test_a_waiting_buffer_hands_out_shared_silence_and_still_carries_out_every_request():
    """While nothing plays, `pull` hands out one read-only silent block (the
    audio callback of a waiting service allocates and measures nothing), yet
    position counts on and a clear or pause asked for meanwhile is carried
    out at the next pull, as before."""
    buf = PlaybackBuffer(16000)
    first, second = buf.pull(320), buf.pull(320)
    assert first is second and not first.flags.writeable and not first.any()
    assert buf.position == 640
    buf.request_clear()
    buf.pull(320)
    assert buf.clear_count == 1 and buf.clears[-1] == 640
    buf.request_pause()
    buf.pull(320)
    assert buf.paused and buf.pauses[-1] == 960
    buf.request_resume()
    buf.enqueue("a", np.full(100, 7, np.int16))
    out = buf.pull(320)
    assert out.flags.writeable and list(out[:100]) == [7] * 100 and not out[100:].any()
    assert buf.span("a") == (1280, 1380) and not buf.paused
