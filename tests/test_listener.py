"""The listener's decisions (voice.speech.listener) without pipecat or any
model: blocks in, decisions out."""

from voice.speech.listener import ForAssistant, Ignored, Listener, WakeAlone

RATE = 16000
BLOCK = 512  # samples


def listener(preroll_s: float = 0.1) -> Listener:
    return Listener(RATE, start_samples=int(0.2 * RATE), preroll_samples=int(preroll_s * RATE), frame=512,
                    max_lead_samples=int(0.5 * RATE))


def block(value: int = 1) -> bytes:
    return bytes([value]) * (BLOCK * 2)


def feed(li: Listener, blocks: int, voiced: bool = False, value: int = 1) -> None:
    for _ in range(blocks):
        li.heard(block(value), voiced)
        li.advance(BLOCK)


def test_the_preroll_keeps_only_its_length():
    li = listener(preroll_s=0.1)  # 1600 samples: three blocks and a bit
    feed(li, 10)
    assert sum(map(len, li.preroll)) <= int(0.1 * RATE) * 2 and len(li.preroll) == 3


def test_an_utterance_begins_with_the_preroll_start_secs_back():
    li = listener()
    feed(li, 10)
    onset = li.start_utterance(BLOCK)
    end = li.position + BLOCK
    assert onset == end - int(0.2 * RATE)
    assert li.speaking and len(li.utterance) == sum(map(len, li.preroll))
    assert li.utterance_start == end - len(li.utterance) // 2


def test_the_onset_that_paused_the_reply_is_the_utterances_when_close_enough():
    li = listener()
    feed(li, 10)
    li.first_frames(4000, paused=True)
    assert li.start_utterance(BLOCK) == 4000
    li.end_utterance()
    li.first_frames(100, paused=True)  # too far back: start_secs back instead
    feed(li, 20)
    assert li.start_utterance(BLOCK) == li.position + BLOCK - int(0.2 * RATE)


def test_voiced_blocks_grow_the_utterance_and_its_voiced_end():
    li = listener()
    feed(li, 4)
    li.start_utterance(BLOCK)
    before = len(li.utterance)
    feed(li, 3, voiced=True)
    feed(li, 2)
    assert len(li.utterance) == before + 5 * BLOCK * 2 and li.voiced_end == li.position - 2 * BLOCK
    audio = li.end_utterance()
    assert len(audio) == before + 5 * BLOCK * 2 and not li.speaking and not li.utterance


def test_without_a_gate_every_utterance_is_for_the_assistant():
    li = listener()
    assert li.addressed(b"ab", 10, gated=False, accepted=False) == ForAssistant(b"ab", skipped=0)


def test_in_wake_mode_an_utterance_without_the_wake_word_is_ignored_unless_it_cut_the_reply():
    li = listener()
    feed(li, 4)
    li.start_utterance(BLOCK)
    feed(li, 20)
    audio = li.end_utterance()
    decided = li.addressed(audio, li.position, gated=True, accepted=False)
    assert isinstance(decided, Ignored) and decided.seconds == (li.position - li.onset) / RATE
    li.barge_in = True
    assert li.addressed(audio, li.position, gated=True, accepted=False) == ForAssistant(audio, skipped=0)


def test_the_wake_word_is_cut_off_by_position_and_alone_it_waits_for_the_request():
    li = listener()
    feed(li, 4)
    li.start_utterance(BLOCK)
    feed(li, 10)
    wake_at = li.woke(BLOCK)
    feed(li, 30)
    audio = li.end_utterance()
    decided = li.addressed(audio, li.position, gated=True, accepted=True)
    cut = wake_at - int(0.2 * RATE)
    assert decided == ForAssistant(audio[(cut - li.utterance_start) * 2:], skipped=(cut - li.utterance_start) * 2)
    assert li.addressed(audio, wake_at + 100, gated=True, accepted=True) == WakeAlone()


def test_speculation_changes_are_reported_once_and_a_dropped_one_let_go():
    li = listener()
    assert li.speculate("What time is it") and not li.speculate("What time is it")
    assert li.speculate(None) and li.speculated is None and not li.speculate(None)
    li.speculate("Stop")
    assert li.end_speculation(dropped=True) and li.speculated is None
    li.speculate("Stop")
    assert not li.end_speculation(dropped=False)


def test_the_vad_restarts_over_the_preroll_on_its_frame_grid():
    li = listener(preroll_s=0.1)
    feed(li, 3)
    li.fed_vad(0)  # it ran up to here, then rested
    fed = li.vad_fed
    feed(li, 7)
    restart = li.vad_restart()
    start = li.position - sum(map(len, li.preroll)) // 2
    skip = -start % 512
    assert (start + skip) % 512 == 0 and restart.skipped == start + skip - fed
    assert len(restart.audio) == sum(map(len, li.preroll)) - skip * 2


def test_the_follow_up_window_opens_when_the_assistant_stops():
    li = listener()
    assert not li.assistant_stopped(True) and not li.assistant_stopped(True)
    assert li.assistant_stopped(False) and not li.assistant_stopped(False)
