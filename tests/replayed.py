"""What a replay of a recorded session must give again: the turns, each
one's words and outcome, the words delivered of each cut reply (±1 word),
and the barge-in decisions. Read from two logs and compared; shared by
tests/test_record_replay.py and tests/live/test_live_record.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from heard import word_errors
from voice.log import events as ev
from voice.log.projections import turn_reply
from voice.log.store import EventStore

ONSET_SLACK = 16000 // 10  # the VAD's onset on the same sound, cut into other blocks (a live device's)
# On another machine than the recording's, Whisper may hear a request a few words differently (its
# arithmetic differs between CPUs: a fresh clone heard "out of the sea" where the recording has
# "amount of C", 3 of 7 words, #35): up to a third of the recorded words, rounded up, is the
# README's promise, and no more.
def recognition_slack(text: str) -> int:
    return -(-len(text.split()) // 3)



@dataclass(frozen=True)
class Turn:
    user_text: str
    outcome: str
    delivered: tuple[str, ...]
    interrupted: bool


@dataclass(frozen=True)
class Session:
    turns: tuple[Turn, ...]
    decisions: tuple[tuple[str, int], ...]  # (speech/paused|resumed|confirmed, onset: mic samples from the track's start)
    stops: tuple[str, ...]  # user/stop intents


def read_session(db: Path, mic_start: int = 0) -> Session:
    store = EventStore(db)
    try:
        conversation = store.latest_conversation()
        events = store.events(conversation)
        turns = []
        for e in events:
            if e.type == ev.TURN_START:
                r = turn_reply(store, conversation, e.turn)
                turns.append(Turn(r.user_text, r.outcome, tuple(r.delivered_text.split()), r.interrupted))
        kinds = (ev.SPEECH_PAUSED, ev.SPEECH_RESUMED, ev.SPEECH_CONFIRMED)
        decisions = tuple((e.type, e.payload["onset"] - mic_start) for e in events if e.type in kinds)
        stops = tuple(e.payload["intent"] for e in events if e.type == ev.USER_STOP)
        return Session(tuple(turns), decisions, stops)
    finally:
        store.close()


def word_edits(a: str, b: str) -> int:
    """Words to insert, delete or replace to make one text the other (case and punctuation aside)."""
    return word_errors(*(text.lower().replace(",", " ").replace(".", " ").split() for text in (a, b)))


def assert_same_outcome(recorded: Session, replayed: Session, *, elsewhere: bool = False) -> None:
    """The replay gave the recorded session again (see the module docstring).
    `elsewhere`: the recording was made on another machine, so each request
    may be recognised up to `recognition_slack` words differently."""
    assert [(t.outcome, t.interrupted) for t in replayed.turns] == [
        (t.outcome, t.interrupted) for t in recorded.turns], (recorded, replayed)
    for was, now in zip(recorded.turns, replayed.turns, strict=True):
        if elsewhere:
            assert word_edits(was.user_text, now.user_text) <= recognition_slack(was.user_text), (
                f"recorded {was.user_text!r}, replayed {now.user_text!r}")
        else:
            assert now.user_text == was.user_text, (recorded, replayed)
    for was, now in zip(recorded.turns, replayed.turns, strict=True):
        n = min(len(was.delivered), len(now.delivered))
        assert abs(len(was.delivered) - len(now.delivered)) <= 1 and was.delivered[:n] == now.delivered[:n], (
            f"delivered {' '.join(was.delivered)!r}, replayed {' '.join(now.delivered)!r}")
    assert [k for k, _ in replayed.decisions] == [k for k, _ in recorded.decisions], (recorded, replayed)
    for (_, was), (_, now) in zip(recorded.decisions, replayed.decisions, strict=True):
        assert abs(was - now) <= ONSET_SLACK, (recorded.decisions, replayed.decisions)
    assert replayed.stops == recorded.stops
