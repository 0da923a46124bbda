"""VoiceSurface with a real PlaybackBuffer and fake synthesized audio whose
word sample ranges are known, so every delivered count can be predicted."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

from autojump import on_autojump
from voice.agent.surface import Delivered, UnitRef
from voice.audio.playback import PlaybackBuffer
from voice.speech.voice_surface import Sentence, VoiceSurface
from voice.speech.tts import SpeechAudio, WordTiming

UNIT_TEXT = "First point. Second point! Third"
REF = UnitRef("c-test", 1, 0, 0)

# Per sentence: (total samples, [(word, char_start, char_end, start, end)]) in sentence coordinates.
LAYOUT = {
    "First point.": (2200, [("First", 0, 5, 0, 1000), ("point.", 6, 12, 1000, 2000)]),
    "Second point!": (1800, [("Second", 0, 6, 0, 800), ("point!", 7, 13, 800, 1600)]),
    "Third": (600, [("Third", 0, 5, 0, 500)]),
}
# Sentences are enqueued back to back from position 0: starts 0, 2200, 4000; end 4600.
# (absolute word end sample, unit text chars delivered once it has played)
WORD_ENDS = [(1000, 5), (2000, 12), (3000, 19), (3800, 26), (4500, 32)]
TOTAL = 4600


def fake_audio(text: str) -> SpeechAudio:
    total, words = LAYOUT[text]
    return SpeechAudio(
        samples=np.ones(total, np.int16),
        rate=16000,
        words=tuple(WordTiming(w, cs, ce, s, e) for w, cs, ce, s, e in words),
        method="alignment",
        seconds=0.0,
    )


def expected_at(position: int) -> tuple[int, int, int]:
    """(text_chars, words, samples) heard at a device position (latency 0)."""
    done = [chars for end, chars in WORD_ENDS if end <= position]
    return (done[-1] if done else 0), len(done), max(0, min(position, TOTAL))


class Recorder:
    def __init__(self) -> None:
        self.sentences: list[Sentence] = []
        self.late: list[tuple[str, UnitRef, dict]] = []

    async def speak(self, sentence: Sentence) -> None:
        self.sentences.append(sentence)

    def on_late(self, kind: str, ref: UnitRef, info: dict) -> None:
        self.late.append((kind, ref, info))


def make_surface(latency: int = 0) -> tuple[VoiceSurface, PlaybackBuffer, Recorder]:
    buf = PlaybackBuffer(16000)
    rec = Recorder()
    surface = VoiceSurface(buf, rec.speak, output_latency=lambda: latency, on_late=rec.on_late)
    return surface, buf, rec


async def spoken_unit(surface: VoiceSurface, rec: Recorder, *, close: bool = True) -> None:
    """Stream the unit text word by word, then give every sentence its audio."""
    surface.open(REF)
    for piece in ("First ", "point. ", "Second ", "point! ", "Third"):
        await surface.text(REF, piece)
    if close:
        await surface.close(REF)
    for s in rec.sentences:
        assert surface.play(s, fake_audio(s.text)) is True


# -- sentence splitting ------------------------------------------------------


@pytest.mark.anyio
async def test_sentences_are_emitted_as_soon_as_their_end_is_seen():
    surface, buf, rec = make_surface()
    surface.open(REF)
    await surface.text(REF, "First ")
    assert rec.sentences == []
    await surface.text(REF, "point. ")
    assert [s.text for s in rec.sentences] == ["First point."]
    await surface.text(REF, "Second ")
    assert len(rec.sentences) == 1
    await surface.text(REF, "point! ")
    assert [s.text for s in rec.sentences] == ["First point.", "Second point!"]
    await surface.text(REF, "Third")
    assert len(rec.sentences) == 2, "an unterminated sentence must wait for close"
    await surface.close(REF)
    assert [s.text for s in rec.sentences] == ["First point.", "Second point!", "Third"]
    assert [s.index for s in rec.sentences] == [0, 1, 2]
    assert [s.char_start for s in rec.sentences] == [0, 13, 27]
    assert all(s.ref == REF for s in rec.sentences)
    for s in rec.sentences:
        assert UNIT_TEXT[s.char_start : s.char_start + len(s.text)] == s.text
    assert rec.sentences[1].key == (REF, 1)
    assert buf.pending() is False  # speaking is not playing


@pytest.mark.anyio
async def test_sentence_end_needs_the_following_whitespace():
    """Streamed as "word" + " word." the end of a sentence is only certain
    when the whitespace after it arrives."""
    surface, _, rec = make_surface()
    surface.open(REF)
    for piece in ("First", " point.", " Second", " point!", " Third"):
        await surface.text(REF, piece)
    assert [(s.text, s.char_start) for s in rec.sentences] == [("First point.", 0), ("Second point!", 13)]
    await surface.close(REF)
    assert [(s.text, s.char_start) for s in rec.sentences] == [
        ("First point.", 0),
        ("Second point!", 13),
        ("Third", 27),
    ]


@pytest.mark.anyio
async def test_close_with_only_whitespace_left_speaks_nothing_more():
    surface, _, rec = make_surface()
    surface.open(REF)
    await surface.text(REF, "Hello there.  \n")
    await surface.close(REF)
    assert [(s.text, s.char_start) for s in rec.sentences] == [("Hello there.", 0)]


# -- delivery as the buffer plays ------------------------------------------


@pytest.mark.anyio
async def test_delivered_grows_word_by_word_as_the_buffer_plays():
    surface, buf, rec = make_surface()
    await spoken_unit(surface, rec)
    assert surface.delivered(REF) == Delivered(0, words=0, samples=0, complete=False)
    assert buf.starts == []

    position = 0
    while position < TOTAL + 200:
        buf.pull(50)
        position += 50
        chars, words, samples = expected_at(position)
        d = surface.delivered(REF)
        assert (d.text_chars, d.words, d.samples) == (chars, words, samples), position
        assert d.complete is (position >= TOTAL), position
    assert buf.starts == [0, 2200, 4000]
    assert surface.delivered(REF) == Delivered(len(UNIT_TEXT), words=5, samples=TOTAL, complete=True)


@pytest.mark.anyio
async def test_a_word_counts_only_once_its_last_sample_played():
    surface, buf, rec = make_surface()
    await spoken_unit(surface, rec)
    buf.pull(999)
    assert surface.delivered(REF).text_chars == 0
    assert surface.delivered(REF).words == 0
    buf.pull(1)  # sample 1000: "First" is whole
    assert surface.delivered(REF).text_chars == 5
    assert UNIT_TEXT[: surface.delivered(REF).text_chars] == "First"
    buf.pull(2999 - 1000)
    assert surface.delivered(REF).text_chars == 12
    buf.pull(1)  # sample 3000: "Second" is whole
    d = surface.delivered(REF)
    assert (d.text_chars, d.words, d.samples) == (19, 3, 3000)
    assert UNIT_TEXT[: d.text_chars] == "First point. Second"


@pytest.mark.anyio
async def test_complete_needs_the_unit_closed():
    surface, buf, rec = make_surface()
    await spoken_unit(surface, rec, close=False)
    assert [s.text for s in rec.sentences] == ["First point.", "Second point!"]
    buf.pull(5000)
    d = surface.delivered(REF)
    assert (d.text_chars, d.words, d.samples, d.complete) == (26, 4, 4000, False)
    await surface.close(REF)
    third = rec.sentences[2]
    assert third.text == "Third"
    d = surface.delivered(REF)
    assert d.complete is False, "the last sentence has no audio yet"
    assert d.text_chars == 26
    assert surface.play(third, fake_audio("Third")) is True
    buf.pull(599)
    assert surface.delivered(REF).complete is False
    assert surface.delivered(REF).text_chars == 32  # "Third" ends at 500 of 600 samples
    buf.pull(1)
    assert surface.delivered(REF) == Delivered(len(UNIT_TEXT), words=5, samples=TOTAL, complete=True)


@pytest.mark.anyio
async def test_output_latency_delays_delivery_by_exactly_that_many_samples():
    surface, buf, rec = make_surface(latency=160)
    await spoken_unit(surface, rec)
    position = 0
    for block in [37] * 140:  # 5180 samples, odd blocks
        buf.pull(block)
        position += block
        chars, words, samples = expected_at(position - 160)
        d = surface.delivered(REF)
        assert (d.text_chars, d.words, d.samples) == (chars, words, samples), position
        assert d.complete is (position - 160 >= TOTAL), position
    # Precisely at a word end.
    surface2, buf2, rec2 = make_surface(latency=160)
    await spoken_unit(surface2, rec2)
    buf2.pull(1159)
    assert surface2.delivered(REF).text_chars == 0
    buf2.pull(1)
    assert surface2.delivered(REF).text_chars == 5


@pytest.mark.anyio
async def test_unknown_unit_delivers_nothing():
    surface, _, _ = make_surface()
    assert surface.delivered(UnitRef("c-test", 9, 9, 9)) == Delivered(0)
    assert surface.is_current(UnitRef("c-test", 9, 9, 9)) is False


# -- stop (barge-in) ----------------------------------------------------------


async def pull_every_5ms(buf: PlaybackBuffer) -> None:
    while True:
        buf.pull(80)
        await anyio.sleep(0.005)


@pytest.mark.anyio
@on_autojump  # the simulated device pulls every 5 ms of virtual time: load cannot starve it
async def test_stop_freezes_delivered_at_what_was_handed():
    surface, buf, rec = make_surface(latency=160)
    await spoken_unit(surface, rec, close=False)
    buf.pull(3100)  # sentence 0 handed whole, sentence 1: 900 of 1800 ("Second" ends at 800)
    d = surface.delivered(REF)
    assert (d.text_chars, d.words, d.samples) == (12, 2, 2940)  # lagging 160 samples
    assert surface.is_current(REF) is True

    async with anyio.create_task_group() as tg:
        tg.start_soon(pull_every_5ms, buf)
        with anyio.fail_after(2):
            await surface.stop()
        assert buf.clears == [3100], "stop returned before the device performed the clear"
        frozen = surface.delivered(REF)
        assert frozen == Delivered(19, words=3, samples=3100, complete=False)
        assert UNIT_TEXT[: frozen.text_chars] == "First point. Second"
        assert surface.is_current(REF) is False
        await anyio.sleep(0.05)  # virtual: the device keeps pulling silence
        tg.cancel_scope.cancel()
    assert buf.position > 3100
    assert surface.delivered(REF) == frozen
    assert buf.handed((REF, 1)) == 900
    assert buf.pending() is False

    # Late audio for the stopped unit is dropped and reported.
    keys_before = buf.keys()
    await surface.close(REF)
    third = rec.sentences[2]
    audio = fake_audio("Third")
    assert surface.play(third, audio) is False
    assert buf.keys() == keys_before
    assert buf.pending() is False
    assert rec.late == [("tts-audio", REF, {"sentence": 2, "samples": 600})]
    assert not buf.pull(1000).any()
    assert surface.delivered(REF) == frozen


@pytest.mark.anyio
@on_autojump  # the 0.5 s give-up passes on the virtual clock
async def test_stop_without_a_device_gives_up_after_a_bounded_wait():
    surface, buf, rec = make_surface()
    await spoken_unit(surface, rec)
    with anyio.fail_after(2):
        await surface.stop()
    assert buf.clears == []  # nobody pulled
    assert surface.is_current(REF) is False


@pytest.mark.anyio
@on_autojump  # the simulated device on the virtual clock
async def test_new_unit_after_stop_plays_normally():
    surface, buf, rec = make_surface()
    await spoken_unit(surface, rec)
    buf.pull(100)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pull_every_5ms, buf)
        with anyio.fail_after(2):
            await surface.stop()
        tg.cancel_scope.cancel()
    ref2 = UnitRef("c-test", 2, 0, 0)
    surface.open(ref2)
    await surface.text(ref2, "Third")
    await surface.close(ref2)
    s = rec.sentences[-1]
    assert s.ref == ref2 and s.text == "Third"
    assert surface.is_current(ref2) is True
    assert surface.play(s, fake_audio("Third")) is True
    out = buf.pull(600)
    assert out.sum() == 600
    assert surface.delivered(ref2) == Delivered(5, words=1, samples=600, complete=True)


# -- discard -------------------------------------------------------------------


@pytest.mark.anyio
async def test_discard_makes_the_unit_not_current():
    surface, buf, rec = make_surface()
    surface.open(REF)
    await surface.text(REF, "First point. ")
    assert surface.is_current(REF) is True
    surface.discard(REF, "error")
    assert surface.is_current(REF) is False
    assert surface.play(rec.sentences[0], fake_audio("First point.")) is False
    assert rec.late == [("tts-audio", REF, {"sentence": 0, "samples": 2200})]
    assert buf.keys() == []
    surface.discard(UnitRef("c-test", 7, 0, 0), "error")  # unknown: no error


# -- waiting -----------------------------------------------------------------------


@pytest.mark.anyio
@on_autojump  # the simulated device on the virtual clock: its ~0.3 s cost no real time
async def test_wait_delivered_returns_once_everything_played():
    surface, buf, rec = make_surface()
    await spoken_unit(surface, rec)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pull_every_5ms, buf)  # 80 samples per 5 ms: ~0.3 s for 4600
        with anyio.fail_after(5):
            d = await surface.wait_delivered(REF)
        tg.cancel_scope.cancel()
    assert d == Delivered(len(UNIT_TEXT), words=5, samples=TOTAL, complete=True)
    assert buf.position >= TOTAL


@pytest.mark.anyio
@on_autojump  # the 0.1 s and the bound below on the loop's virtual clock
async def test_wait_delivered_is_cancellable():
    surface, buf, rec = make_surface()
    await spoken_unit(surface, rec)
    result = []
    start = anyio.current_time()
    with anyio.fail_after(2):
        with anyio.move_on_after(0.1) as scope:
            result.append(await surface.wait_delivered(REF))  # nobody pulls: never completes
    assert scope.cancelled_caught
    assert result == []
    assert anyio.current_time() - start < 1.0


@pytest.mark.anyio
async def test_notice_is_spoken_as_its_own_unit():
    surface, buf, rec = make_surface()
    await surface.notice("The model failed. Try again")
    assert [s.text for s in rec.sentences] == ["The model failed.", "Try again"]
    ref = rec.sentences[0].ref
    assert ref.conversation == "notice"
    assert surface.is_current(ref) is True


@pytest.mark.anyio
async def test_a_sentence_that_cannot_be_synthesized_is_skipped_not_awaited_forever():
    """SpeakProcessor turns a synthesis error into empty audio: the unit
    completes, and the unsaid sentence's words are not delivered."""
    import asyncio

    from voice.speech.pipeline import SpeakFrame, SpeakProcessor, SpeechAudioFrame

    class BrokenTts:
        rate = 16000

        def synthesize(self, text):
            raise RuntimeError("espeak cannot say this")

    late, pushed = [], []

    class Events:
        def late(self, kind, ref, info):
            late.append(kind)

    buffer = PlaybackBuffer(16000)
    spoken = []

    async def speak(sentence):
        spoken.append(sentence)

    surface = VoiceSurface(buffer, speak=speak)
    processor = SpeakProcessor(BrokenTts(), surface, Events())

    async def capture(frame, direction=None):
        pushed.append(frame)

    processor.push_frame = capture  # the processor's downstream edge
    ref = UnitRef("c", 1, 0, 0)
    surface.open(ref)
    await surface.text(ref, "Unsayable words here.")
    await surface.close(ref)
    from pipecat.processors.frame_processor import FrameDirection

    await asyncio.wait_for(SpeakProcessor.process_frame(processor, SpeakFrame(sentence=spoken[0]),
                                                        FrameDirection.DOWNSTREAM), 5)
    (frame,) = [f for f in pushed if isinstance(f, SpeechAudioFrame)]
    assert len(frame.audio.samples) == 0 and late == ["tts-failed"]
    surface.play(frame.sentence, frame.audio)
    delivered = await asyncio.wait_for(surface.wait_delivered(ref), 2)  # settles: nothing more will play
    assert not delivered.complete and delivered.words == 0 and delivered.text_chars == 0


@pytest.mark.anyio
async def test_speaking_text_holds_only_replies_still_playing():
    """The barge-in judge compares what it heard with what the assistant is
    saying now: a reply that finished long ago must not count."""
    buffer = PlaybackBuffer(16000)

    async def speak(sentence):
        pass

    surface = VoiceSurface(buffer, speak=speak)
    old, new = UnitRef("c", 1, 0, 0), UnitRef("c", 2, 0, 0)
    for ref, text in ((old, "What was that about London?"), (new, "Tides follow the moon.")):
        surface.open(ref)
        await surface.text(ref, text)
        await surface.close(ref)
    (old_sentence,) = [s for s in surface._units[old].sentences]
    surface.play(old_sentence, SpeechAudio(np.ones(320, np.int16), 16000,
                                           (WordTiming("What", 0, 4, 0, 320),), "alignment", 0.0))
    buffer.pull(640)  # the old reply has played to the end; the new one is not synthesized yet
    assert surface.speaking_text() == "Tides follow the moon."


@pytest.mark.anyio
async def test_speaking_text_is_what_the_speaker_says_not_the_markdown():
    """The echo judge compares what the microphone heard with what the
    assistant is saying: its spoken form ("kilometers per second"), so the
    assistant's own voice heard back is recognised as such."""
    from voice.speech.judge import is_own_echo

    surface, _, rec = make_surface()
    surface.open(REF)
    await surface.text(REF, "1. **Mercury** is about 58 km/s fast.\n")
    assert [s.text for s in rec.sentences] == ["1, Mercury is about 58 kilometers per second fast."]
    assert surface.speaking_text() == "1, Mercury is about 58 kilometers per second fast."
    assert is_own_echo("Mercury is about 58 kilometers per second.", surface.speaking_text())


@pytest.mark.anyio
async def test_a_lost_speaker_delivers_what_had_come_out_of_it_not_what_was_handed():
    """Issue #36: the audio server died with 3100 samples handed over, of
    which only 2500 had left the speaker: the words up to 2500 were heard,
    the rest of what was handed never played, and nothing queued plays on
    the reopened device."""
    surface, buf, rec = make_surface(latency=160)
    await spoken_unit(surface, rec)
    buf.pull(3100)
    surface.lose(2500)
    d = surface.delivered(REF)
    assert d == Delivered(*expected_at(2500)[:1], words=2, samples=2500, complete=False)
    assert UNIT_TEXT[: d.text_chars] == "First point."
    assert surface.is_current(REF) is False
    assert not buf.pull(1000).any()  # the reopened device: the queue was dropped at its first pull
    assert buf.clears == [3100]
    assert surface.delivered(REF) == d  # and stays so
