"""Flat memory and flat per-turn cost (issue #14): every structure kept per
turn is bounded, and each of these tests fails if it grows with turns. The
soak (benchmarks/soak.py) measures the whole process; these pin each part."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import anyio
import pytest
from acp import text_block

from conftest import scripted
from voice.settings import Settings
from voice.agent.surface import UnitRef
from voice.agent.timer_service import TimerService
from voice.app import open_app
from voice.audio.clock import VirtualClock, run_on_virtual_clock
from voice.audio.playback import KEEP_MARKS, PlaybackBuffer
from voice.audio.replay_device import KEEP_TICKS, ReplayDevice, UserClip
from voice.log import events as ev
from voice.log.window import derive_window
from voice.service.acp_server import KEEP_SESSIONS, VoiceAcpAgent
from voice.speech.tts import SpeechAudio
from voice.speech.voice_surface import VoiceSurface

from timeline import default_config

C = "c-test"


def test_the_playback_buffer_keeps_the_newest_marks_only():
    buf = PlaybackBuffer(16000)
    for n in range(5 * KEEP_MARKS):
        buf.enqueue(("k", n), np.ones(10, np.int16))
        buf.request_pause()
        buf.pull(5)
        buf.request_resume()
        buf.pull(5)
        buf.request_clear()
        buf.pull(5)
        buf.forget(("k", n))
    for marks in (buf.starts, buf.pauses, buf.resumes, buf.clears):
        assert KEEP_MARKS <= len(marks) <= 2 * KEEP_MARKS
    assert buf.clear_count == 5 * KEEP_MARKS  # (what a wait for the next clear counts on)
    assert buf.tracked() == 0
    assert buf.clears[-1] == buf.position - 5  # the newest are the ones kept


def test_a_finite_replays_buffer_keeps_every_mark():
    buf = PlaybackBuffer(16000, keep=None)
    for n in range(3 * KEEP_MARKS):
        buf.request_clear()
        buf.pull(1)
    assert len(buf.clears) == 3 * KEEP_MARKS


def test_speaking_leaves_no_memory_behind():
    """Found in the 1,000-turn soak (heap in use +12 KB a turn, linear):
    espeak-ng keeps ~1.3 KB in every voice change, and piper set the voice
    before each phonemization. Measured with glibc's own count of the heap
    in use, over the calls synthesis makes: the phonemization of a sentence
    and of each of its words."""
    import ctypes

    from voice.speech.tts import PiperEngine

    # (benchmarks/soak.py reads the same counts; benchmarks/ is not importable from the tests)
    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
    except (OSError, AttributeError):
        pytest.skip("glibc's mallinfo2 is needed to count the heap")

    voice = PiperEngine(16000)._voice
    said = "Right away. Ten kilometres is six miles.".split()
    for word in said * 20:  # warm up
        voice.phonemize(word)
    before = libc.mallinfo2().uordblks
    for word in said * 400:  # 2,800 phonemizations: 3.6 MB with the leak
        voice.phonemize(word)
    grown = (libc.mallinfo2().uordblks - before) / 2**20
    assert grown < 0.5, f"the heap grew {grown:.1f} MB over 2,800 phonemizations"


def run_device(scenario, *, record: bool) -> ReplayDevice:
    """A replay device played to its scenario's end (play_to_end)."""
    return play_to_end(ReplayDevice(scenario, idle=lambda: True, record=record))


def play_to_end(device: ReplayDevice) -> ReplayDevice:
    """`device` played to its scenario's end on a virtual clock, with an idle
    assistant and nothing listening to its mic."""
    async def on_mic(block: bytes, reference: bytes) -> None:
        return None

    device.idle = lambda: True
    clock = VirtualClock()
    clock.install()
    try:
        run_on_virtual_clock(device.run(on_mic), clock)
    finally:
        clock.uninstall()
    return device


def test_a_replay_device_that_keeps_nothing_forgets_the_clips_it_has_played():
    """Found in the 1,000-turn soak: one PlacedClip per request, kept for ever."""
    quiet = np.zeros(800, np.int16)  # 50 ms each
    clips = tuple(UserClip(quiet, f"c{n}.wav", "at" if n == 0 else "after_idle", 0.0 if n == 0 else 0.05, 0)
                  for n in range(200))
    scenario = SimpleNamespace(path=Path("x.toml"), users=clips, echo=None, tail=0.1, max_duration=60.0, blocks=(),
                               losses=())

    bounded, recorded = run_device(scenario, record=False), run_device(scenario, record=True)
    assert bounded.clips_placed == recorded.clips_placed == len(recorded.placed) == 200
    assert len(bounded.placed) <= 2 and bounded.placed[-1].clip.name == "c199.wav"
    assert bounded.position == recorded.position


@pytest.mark.anyio
async def test_the_voice_surface_holds_the_newest_units_and_their_chunks_only():
    buf = PlaybackBuffer(16000)
    spoken = []

    async def speak(sentence) -> None:
        spoken.append(sentence)

    surface = VoiceSurface(buf, speak=speak, keep=8)
    words = (SimpleNamespace(start=0, end=10, char_start=0, char_end=5),)
    for turn in range(1, 200):
        ref = UnitRef(C, turn, 0, 0)
        surface.open(ref)
        await surface.text(ref, "Hello there. ")
        await surface.close(ref)
        for sentence in spoken:
            surface.play(sentence, SpeechAudio(np.ones(10, np.int16), 16000, words, "characters", 0.0))
        spoken.clear()
        buf.pull(20)
        assert (await surface.wait_delivered(ref)).complete
        await surface.notice("A timer is done.")  # notices are units too
    assert surface.held() <= 8
    assert buf.tracked() <= 8  # one sentence a unit: the chunks of the held units only


def test_replay_tick_lateness_is_bounded_unless_the_device_records():
    clip = UserClip(np.zeros(1600, np.int16), "silence.wav", "at", 0.0, 0)
    scenario = SimpleNamespace(path=Path("x.toml"), users=(clip,), echo=None, tail=(KEEP_TICKS + 500) / 50,
                               max_duration=(KEEP_TICKS + 600) / 50, blocks=(), losses=())

    bounded, recorded = run_device(scenario, record=False), run_device(scenario, record=True)
    assert bounded.position == recorded.position > KEEP_TICKS * 320
    assert len(bounded.tick_lateness) == KEEP_TICKS and not bounded.mic_blocks and not bounded.played_blocks
    assert len(recorded.tick_lateness) >= recorded.position // 320 - 1 > KEEP_TICKS


def chat_turn(store, n: int) -> None:
    turn = store.start_turn(C, ev.TurnStart(source="text"))
    store.record(C, ev.UserMessage(content=f"question {n} " + "x" * 100), turn=turn)
    store.record(C, ev.AssistantMessage(message_id=f"m{turn}", content=[{"type": "text", "text": "y" * 100}]),
                 turn=turn, step=0, attempt=0)
    store.end_turn(C, turn, ev.COMPLETED)


def rows_read(store, monkeypatch, call) -> int:
    read = []
    events = store.events

    def counting(*args, **kwargs):
        out = events(*args, **kwargs)
        read.append(len(out))
        return out

    monkeypatch.setattr(store, "events", counting)
    try:
        call()
    finally:
        monkeypatch.undo()
    return sum(read)


def test_a_window_reads_the_window_not_the_conversation(store, monkeypatch):
    for n in range(50):
        chat_turn(store, n)
    short = rows_read(store, monkeypatch, lambda: derive_window(store, C, 400))
    for n in range(50, 400):
        chat_turn(store, n)
    long = rows_read(store, monkeypatch, lambda: derive_window(store, C, 400))
    assert long == short <= 2 * 16 * 2  # at most two batches of turns, two rows each (the turns read, no more)


def test_a_new_turn_id_comes_from_an_index(store):
    plan = " ".join(str(r) for r in store._db.execute(
        "EXPLAIN QUERY PLAN SELECT COALESCE(MAX(turn), 0) FROM events"))
    assert "turn_ids" in plan, plan


@pytest.mark.anyio
async def test_timers_are_read_from_the_log_once(store, monkeypatch):
    said = []

    async def announce(text: str) -> None:
        said.append(text)

    service = TimerService(store, announce)
    service.set(600, "tea", C, None, None)
    reads = []
    events = store.events
    monkeypatch.setattr(store, "events", lambda *a, **k: reads.append(1) or events(*a, **k))
    for n in range(50):
        service.set(600 + n, f"t{n}", C, None, None)
        assert service.cancel(f"t{n}", C, None) is not None
    assert [t.label for t in service.active()] == ["tea"]
    assert reads == []
    monkeypatch.undo()
    # A restart rebuilds them from the log.
    assert [t.label for t in TimerService(store, announce).active()] == ["tea"]


@pytest.mark.anyio
async def test_acp_sessions_held_stay_bounded_and_a_released_one_answers(tmp_path):
    class Conn:
        async def session_update(self, session_id, update) -> None:
            return None

    replies = [{"text": f"Reply {n}.", "chunk_delay_ms": 0} for n in range(3 * KEEP_SESSIONS + 2)]
    async with open_app(Settings.from_config(default_config()), db=tmp_path / "events.db", llm=scripted(*replies),
                        data_dir=tmp_path / "data", recovery=False) as app:
        async with anyio.create_task_group() as tg:
            acp = VoiceAcpAgent(app, tg)
            acp.on_connect(Conn())
            ids = []
            for n in range(3 * KEEP_SESSIONS):
                ids.append((await acp.new_session(cwd=str(tmp_path))).session_id)
                await acp.prompt(ids[-1], [text_block(f"hello {n}")])
            assert len(acp.sessions) <= KEEP_SESSIONS
            assert ids[0] not in acp.sessions
            response = await acp.prompt(ids[0], [text_block("me again")])
            assert response.stop_reason == "end_turn"
        assert [e.body.content for e in app.store.events(ids[0], types={ev.USER_MESSAGE})] == ["hello 0", "me again"]


@pytest.mark.anyio
async def test_the_text_and_acp_surfaces_hold_the_newest_units_only():
    import io

    from voice.agent.surface import KEEP_UNITS
    from voice.surfaces.acp import AcpSurface
    from voice.surfaces.text import TextSurface

    class Conn:
        async def session_update(self, session_id, update) -> None:
            return None

    for surface in (TextSurface(out=io.StringIO()), AcpSurface(Conn(), C)):
        for turn in range(1, 4 * KEEP_UNITS):
            ref = UnitRef(C, turn, 0, 0)
            surface.open(ref)
            await surface.text(ref, "Hello.")
            await surface.close(ref)
            assert surface.delivered(ref).text_chars == len("Hello.")
        assert len(surface._units) == KEEP_UNITS


def test_the_turn_runner_holds_the_newest_turns_only(tmp_path):
    from timeline import Timeline, after_reply, at, run_timeline

    clips = [at(0.5, "what_time.wav", "What time is it?")]
    clips += [after_reply(0.5, f, t) for f, t in (("three_points.wav", "Give me three points."),
                                                  ("tell_london.wav", "Tell me about London."),
                                                  ("add_note.wav", "Note: buy milk."),
                                                  ("set_timer.wav", "Set a timer."))]
    outcome = run_timeline(Timeline(clips=clips, replies=[{"text": f"Reply {n}.", "chunk_delay_ms": 10}
                                                          for n in range(5)], keep=2), tmp_path)
    turns = sorted({e.turn for e in outcome.events if e.type == ev.TURN_END})
    assert len(turns) == 5
    assert [t.turn for t in outcome.turns] == turns[-2:]  # the newest two: not one per turn
