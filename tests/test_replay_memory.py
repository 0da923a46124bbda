"""`voice replay` in flat memory (issue #27, point 2): the replay writes
mic.wav and played.wav as it goes (a killed replay keeps what it played),
and its device keeps no sound and no per-tick figures, only what the
summary reads. The RSS over a long replay is measured, not tested:
benchmarks/replay_memory.py."""

from __future__ import annotations

import json
import os
import wave
from pathlib import Path
from types import SimpleNamespace

import anyio
import numpy as np
import pytest

from killpoint import killpoints_fixture
from test_flat_memory import play_to_end
from voice.agent.providers.base import ModelRequest
from voice.agent.providers.scripted import ScriptedProvider, parse_replies
from voice.agent.surface import UnitRef
from voice.audio.playback import PlaybackBuffer
from voice.audio.replay_device import KEEP_TICKS, ReplayDevice, UserClip
from voice.audio.wav import read_mono16k
from voice.log import events as ev
from voice.log.store import EventStore
from voice.service.replay import SpeechSpans, replay_device
from voice.service.requests_file import RequestsFile

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "tests" / "fixtures" / "scenarios" / "markdown.toml"  # three turns: a reply played out first

killpoints = killpoints_fixture()


@pytest.mark.slow  # a whole `voice replay`, its models loaded
def test_a_killed_replay_leaves_readable_sound_up_to_where_it_was(tmp_path, killpoints):
    """SIGKILL right after the first reply's first sentence is in the log:
    mic.wav and played.wav are there, readable, and hold the sound up to
    that sentence's last sample (same sample clock), which is speech; and
    requests.json is whole JSON holding the request that reply answers
    (written as it was asked, not kept in memory for the end)."""
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path / "config")}
    run = killpoints.run(["replay", str(SCENARIO), "--out", str(out)], env=env, out=tmp_path / "run",
                         kill_after="speech/sentence")
    assert run["signal"] == 9, run["stderr"][-3000:]
    assert not (out / "summary.json").exists()  # killed before the end: nothing written afterwards
    store = EventStore(out / "events.db")
    try:
        first = next(e.body for e in store.events() if e.type == ev.SPEECH_SENTENCE)
    finally:
        store.close()
    assert first.start is not None and first.handed > 0
    end = first.start + first.handed
    played, mic = read_mono16k(out / "played.wav"), read_mono16k(out / "mic.wav")
    assert len(played) == len(mic) >= end  # every block went to both tracks
    assert np.abs(played[first.start:end]).max() > 1000  # the sentence itself, not silence
    assert np.abs(mic[: int(0.5 * 16000) + 16000]).max() > 1000  # the first request (at 0.5 s)
    for name in ("mic.wav", "played.wav"):  # the header says what the file holds: nothing needs fixing
        with wave.open(str(out / name), "rb") as w:
            assert w.getnframes() * 2 + 44 == (out / name).stat().st_size
    assert (out / "requests.json").is_file(), "a killed replay left no record of what the model was asked"
    requests = json.loads((out / "requests.json").read_text())
    assert len(requests) == 1  # the first turn's request, and nothing after the kill
    assert requests[0][-1]["role"] == "user" and requests[0][-1]["content"]


def test_the_replays_requests_go_to_disk_as_asked_and_stay_out_of_memory(tmp_path):
    """A long replay's model requests (each the whole message window) are
    not held to the end: the scripted provider hands each to the file,
    which is whole JSON after every one."""
    file = RequestsFile(tmp_path / "requests.json")
    assert json.loads(file.path.read_text()) == []
    provider = ScriptedProvider(parse_replies([{"text": "One."}, {"text": "Two."}], "test"), on_request=file.add)

    async def ask(text: str) -> None:
        async for _ in provider.stream(ModelRequest(messages=[{"role": "user", "content": text}])):
            pass

    for n, text in enumerate(["first", "second, with \"quotes\" and é"], 1):
        anyio.run(ask, text)
        assert json.loads(file.path.read_text()) == [[{"role": "user", "content": t}]
                                                     for t in ["first", "second, with \"quotes\" and é"][:n]]
    assert provider.requests == [] and provider.asked == 2
    file.close()


def long_scenario(clips: int) -> SimpleNamespace:
    """`clips` half-second clips, one after another, over twice KEEP_TICKS ticks."""
    loud = (np.sin(np.arange(8000) / 5) * 8000).astype(np.int16)
    users = tuple(UserClip(loud, f"c{n}.wav", "at" if n == 0 else "after_idle", 0.0 if n == 0 else 0.4, 0)
                  for n in range(clips))
    return SimpleNamespace(path=Path("x.toml"), users=users, echo=None, tail=1.0, max_duration=600.0, blocks=(),
                           losses=())


def test_the_replays_device_keeps_no_sound_and_no_figure_per_tick():
    scenario = long_scenario(2 * KEEP_TICKS // 45)  # 0.9 s a clip: 120 s in all
    device = play_to_end(replay_device(scenario))
    assert device.position > 2 * KEEP_TICKS * 320
    retained = sum(len(b) for b in device.mic_blocks) + sum(len(b) for b in device.played_blocks)
    assert retained == 0, f"the replay's device holds {retained} samples of sound"
    assert len(device.tick_lateness) <= KEEP_TICKS
    # What the summary reads: every clip placed, where a device that records places it; every tick
    # counted, and the lateness figure a full list of them gives (the same device's: lateness is real time)
    assert [p.clip.name for p in device.placed] == [c.name for c in scenario.users]
    assert device.position // 320 - 1 <= sum(device.lateness_counts.values()) <= device.position // 320  # (not the last)
    recorded = play_to_end(ReplayDevice(scenario, idle=lambda: True, record=True))
    assert [(p.start, p.onset) for p in device.placed] == [(p.start, p.onset) for p in recorded.placed]
    full = sorted(recorded.tick_lateness)
    assert recorded.lateness_p99_ms() == round(full[int(0.99 * (len(full) - 1))] * 1000, 1)


def test_the_lateness_percentile_from_counts_is_the_sorted_lists():
    device = ReplayDevice(long_scenario(1), idle=lambda: True, record=False, summarize=True)
    rng = np.random.default_rng(3)
    ticks = list(rng.exponential(0.002, 5000)) + [0.0] * 100
    for late in ticks:
        device.lateness_counts[round(late * 1000, 1)] += 1
    full = sorted(ticks)
    assert device.lateness_p99_ms() == round(full[int(0.99 * (len(full) - 1))] * 1000, 1)
    assert ReplayDevice(long_scenario(1), idle=lambda: True).lateness_p99_ms() == 0.0  # no tick yet


def test_a_turns_speech_span_outlives_the_sentences_the_buffer_forgets():
    """The summary's speech_start_s/speech_end_s: the first and last sample
    of a turn's sentences that played, after the voice surface has let them
    go (a replay holds the newest units only)."""
    buffer = PlaybackBuffer(16000)
    spans = SpeechSpans(buffer)
    first, second, other = UnitRef("c", 1, 0, 0), UnitRef("c", 1, 1, 0), UnitRef("c", 2, 0, 0)
    buffer.pull(100)  # silence first: spans are device positions
    for key in ((first, 0), (first, 1), (second, 0)):
        buffer.enqueue(key, np.ones(300, np.int16))
    buffer.enqueue((other, 0), np.ones(500, np.int16))
    buffer.pull(1000)  # turn 1's three sentences, and 100 samples of turn 2's
    buffer.request_clear()  # turn 2 is cut: what was handed over is its span
    buffer.pull(10)
    for key in buffer.keys():
        buffer.forget(key)
    assert buffer.tracked() == 0
    assert spans.of("c", 1) == (100, 1000)
    assert spans.of("c", 2) == (1000, 1100)
    assert spans.of("c", 3) is None  # no speech
