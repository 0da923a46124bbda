"""The voice surface: the agent loop's text becomes queued sentences, each
sentence becomes audio with word timings, and `delivered()` reports the
words whose audio has fully come out of the speaker.

What is synthesized is the speakable form of the model's text
(speech/speakable.py: no Markdown symbols, lists, links and units read as
words); what is delivered is a prefix of the model's own text, cut at the
last source character whose spoken words have all played. A spoken token
counts only once its last sample played: "3.5" read as "three point five"
is heard when "five" has played, so a cut inside "**3.5 km**" after
"three point five" records "**3.5", and "km**" needs "kilometers" whole.

Delivered while playing = samples handed to the device minus its output
latency. After `stop()` the buffer is cleared in the device callback, and
what had already been handed over will still play, so delivered = handed.

Units (assistant messages) are keyed by `UnitRef`; a unit that was stopped
or discarded is no longer current, and audio that arrives for it later is
dropped and logged as late (`late/output`).

Memory stays flat over a service's life: only the newest `keep` units are
held (their text, sentences and word timings, and the playback buffer's
bookkeeping of their chunks); an older one has long settled and its
delivery has been recorded. A unit evicted is treated as unknown: late audio
for it is dropped like any other. `keep=None` holds every unit (a finite
replay reads them all for its summary).

Waiting (`wait_delivered`, `stop`) is driven by the playback buffer's
notifications (a chunk started or finished, a clear, a pause or resume;
sent from the audio callback's thread) and by the surface's own changes;
the only timed wait is for the device's output latency to pass once the
last sample was handed over, computed from that latency.

Once a unit is settled (`wait_delivered` returns) or stopped, its sentences
and where they played go to `on_sentences` as `speech/sentence` bodies, one
per sentence (the word timings of `voice show`).

From `lose()` (the speaker went) until `found()`, a notice is not spoken
into a dead device: it is kept (`unsaid`), whole, for voice.speech.audio_loss
to say once the speaker is back or to write down after the idle gap; so is
a phrase the lost speaker kept from a turn (`owe()`), whenever it comes.

A reply opened meanwhile (a request typed while the speaker is gone) is lost
from its start: nothing of it is synthesized or queued, it is settled with
nothing heard as soon as its text is all there, and that text is written to
the transcript as not said. Not kept for later, as a notice is: a typed
request is usually made by someone at the keyboard, who wants the answer
now, in text, and whose turn (and `voice ctl say`) must not wait on a
speaker that plays nothing.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from voice.agent.surface import Delivered, UnitRef
from voice.audio.playback import PlaybackBuffer
from voice.log.events import SpeechSentence
from voice.speech.speakable import SpeakableStream, SpokenSentence
from voice.speech.tts import SpeechAudio, Synthesis

_SNAKE = re.compile(r"\b[A-Za-z]+(?:_+[A-Za-z]+)+\b")  # unlock_door, home__unlock_door
_CAMEL = re.compile(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)+\b")  # HassTurnOff
# What is never read aloud: URLs, paths, config keys and markup.
_UNSPEAKABLE = re.compile(r"\S*(?:://|/|\\|~|`|\*|_|#)\S*")


def spoken_notice(text: str) -> str:
    """What of a notice is said aloud: its head (before the first ": ", the
    detail is for the transcript), without paths, URLs or markup; a tool's
    name read as words ("unlock_door" as "unlock door", "HassTurnOff" as
    "Hass Turn Off")."""
    head, detail, _ = text.partition(": ")
    head = _SNAKE.sub(lambda m: m.group(0).replace("_", " "), head)
    head = _CAMEL.sub(lambda m: re.sub(r"(?<=[a-z])(?=[A-Z])", " ", m.group(0)), head)
    spoken = " ".join(_UNSPEAKABLE.sub("", head).split())
    if detail:  # the head ends where the detail began: end it as a sentence
        spoken = spoken.rstrip(" .,;:") + "." if spoken.strip(" .,;:") else ""
    return spoken[:1].upper() + spoken[1:]


@dataclass(frozen=True)
class Sentence:
    ref: UnitRef
    index: int
    text: str  # what is synthesized: the speakable form
    char_start: int  # where its source begins in the unit's text (the model's own)
    spoken: SpokenSentence  # its source span and the map from spoken words back to it

    @property
    def key(self) -> tuple[UnitRef, int]:
        return (self.ref, self.index)

    def delivered_chars(self, spoken_end: int) -> int:
        """Characters of the unit's text delivered once this sentence's
        spoken text up to `spoken_end` (a `WordTiming.char_end`) has played."""
        return self.spoken.delivered_chars(spoken_end)


@dataclass(frozen=True)
class _Said:
    """A synthesized sentence as delivery sees it."""

    words: tuple
    length: int
    method: str
    synthesis: Synthesis | None  # when it was asked for and ready


@dataclass
class _Unit:
    ref: UnitRef
    stream: SpeakableStream = field(default_factory=SpeakableStream)  # the text, cut into spoken sentences
    sentences: list[Sentence] = field(default_factory=list)
    audio: dict[int, _Said] = field(default_factory=dict)
    closed: bool = False  # the stream is closed: every sentence of it is in `sentences`
    current: bool = True
    stopped: bool = False
    heard_to: int | None = None  # stopped by a lost speaker: what had come out of it (a device position)
    unheard: bool = False  # opened while the speaker was lost: none of it is synthesized or played
    logged: bool = False  # its speech/sentence bodies were handed on

    @property
    def text(self) -> str:
        return self.stream.text


@dataclass(frozen=True)
class Unsaid:
    """A notice the lost speaker could not say (a completion phrase, a timer)."""

    text: str
    at_wall: float  # when it was kept (time.time: a replay's virtual clock)


@dataclass
class VoiceSurface:
    buffer: PlaybackBuffer
    speak: Callable[[Sentence], Awaitable[None]]  # hands a sentence to synthesis
    output_latency: Callable[[], int] = lambda: 0  # samples, as the device reports
    on_late: Callable[[str, UnitRef, dict], None] = lambda kind, ref, info: None
    on_notice: Callable[[str], None] = lambda text: None  # the whole notice, for the transcript
    on_sentences: Callable[[UnitRef, list[SpeechSentence]], None] = lambda ref, bodies: None
    # (message_id, sentence index) -> the speaker position where it began playing when it was
    # recorded: a replayed recording plays each sentence from there (voice.service.recording), not sooner
    play_at: dict[tuple[str, int], int] = field(default_factory=dict)
    tracks_playback: bool = True
    answers_questions: bool = True  # the session routes the person's next words to a question (approvals)
    keep: int | None = 64  # units held, the newest (see the module docstring)
    speaker_lost: bool = False  # from lose() to found(): notices are kept, not said
    unsaid: list[Unsaid] = field(default_factory=list)  # kept meanwhile, oldest first
    _units: dict[UnitRef, _Unit] = field(default_factory=dict)
    _unsaid_changed: anyio.Event | None = None  # set at the next notice kept, or at found()
    _notices: int = 0
    _changed: anyio.Event | None = None  # set (and dropped) at the next change of what plays
    _loop: asyncio.AbstractEventLoop | None = None

    def __post_init__(self) -> None:
        self.buffer.subscribe(self._buffer_changed)

    # -- Surface -----------------------------------------------------------

    def open(self, ref: UnitRef) -> None:
        unit = self._units[ref] = _Unit(ref)
        if self.speaker_lost:  # lost from its start (see the module docstring): nothing of it plays
            unit.current, unit.unheard = False, True
        while self.keep is not None and len(self._units) > self.keep:
            self._evict(next(iter(self._units)))

    def _evict(self, ref: UnitRef) -> None:
        """Forget the oldest unit and its chunks' bookkeeping."""
        unit = self._units.pop(ref)
        for sentence in unit.sentences:
            self.buffer.forget(sentence.key)

    def held(self) -> int:
        """Units held (a test that it stays bounded)."""
        return len(self._units)

    async def text(self, ref: UnitRef, text: str) -> None:
        unit = self._units[ref]
        await self._emit(unit, unit.stream.feed(text))

    async def reasoning(self, ref: UnitRef, text: str) -> None:
        return None  # reasoning is not spoken, so it is never delivered

    async def close(self, ref: UnitRef) -> None:
        """Speak what is left after the last sentence end."""
        unit = self._units[ref]
        last = unit.stream.close()
        unit.closed = True
        await self._emit(unit, last)
        if unit.unheard and unit.text.strip():
            self.on_notice(f"{unit.text.strip()} (not said: the audio device was lost)")
        self._notify()

    def discard(self, ref: UnitRef, reason: str) -> None:
        """A failed attempt: what of it is still queued never plays."""
        unit = self._units.get(ref)
        if unit is not None:
            unit.current = False
            self.buffer.request_drop({s.key for s in unit.sentences})
            self._notify()

    def delivered(self, ref: UnitRef) -> Delivered:
        return self._progress(ref)[0]

    def _progress(self, ref: UnitRef) -> tuple[Delivered, bool, float | None]:
        """What was heard of the unit; whether it is settled (nothing more
        of it will play: all synthesized and played, or skipped); and, when
        it is not, how long until more of it is heard without any change
        (None: not before something changes)."""
        unit = self._units.get(ref)
        if unit is None:
            return Delivered(0), True, None
        latency = self.output_latency()
        chars = words = samples = 0
        settled, unsaid, due_s = True, False, None
        for s in unit.sentences:
            audio = unit.audio.get(s.index)
            if audio is None:
                settled = False
                break
            if audio.method == "failed":  # synthesis failed: nothing of it was heard
                unsaid = True
                continue
            heard = self._heard_when_stopped(unit, s.key) if unit.stopped else self.buffer.heard(s.key, latency)
            samples += heard
            played_words = [w for w in audio.words if w.end <= heard]
            if not unsaid:  # the delivered prefix stops at the first sentence that was not said
                words += len(played_words)
                if played_words:
                    chars = s.delivered_chars(played_words[-1].char_end)
            if heard < audio.length:
                settled = False
                if self.buffer.handed(s.key) == audio.length and not self.buffer.paused:
                    due_s = (audio.length - heard) / self.buffer.rate  # in the device, on its way out
                break
        complete = settled and unit.closed and not unsaid
        settled = (settled or unit.unheard) and unit.closed  # (nothing of an unheard unit is ever synthesized)
        if complete:
            chars = len(unit.text)
        return Delivered(text_chars=chars, words=words, samples=samples, complete=complete), settled, due_s

    async def wait_delivered(self, ref: UnitRef) -> Delivered:
        while True:
            changed = self._arm()  # before looking: a change from now on sets it
            delivered, settled, due_s = self._progress(ref)
            if settled:
                self._hand_on_sentences(self._units.get(ref))
                return delivered
            with anyio.move_on_after(due_s if due_s is not None else float("inf")):
                await changed.wait()

    async def stop(self) -> None:
        stopped = [unit for unit in self._units.values() if unit.current]
        for unit in stopped:
            unit.current, unit.stopped = False, True
        done = self.buffer.clear_count
        self.buffer.request_clear()
        with anyio.move_on_after(0.5):  # the device performs the clear at its next block
            while self.buffer.clear_count == done:
                await self._arm().wait()
        for unit in stopped:  # what was handed over is now final
            self._hand_on_sentences(unit)

    def lose(self, heard_to: int) -> None:
        """The speaker went away (voice.speech.audio_loss): what the current
        units delivered is what had come out of it by device position
        `heard_to`, not what was handed to it; the rest never plays (the
        queue is dropped at the next pull, of the reopened device)."""
        lost = [unit for unit in self._units.values() if unit.current]
        for unit in lost:
            unit.current, unit.stopped, unit.heard_to = False, True, heard_to
        self.buffer.request_clear()
        for unit in lost:
            self._hand_on_sentences(unit)
        self.speaker_lost = True
        self._notify()

    def found(self) -> None:
        """The speaker is back: notices are said again (and those kept meanwhile are due)."""
        self.speaker_lost = False
        self._unsaid_wake()

    def owe(self, text: str) -> None:
        """An outcome phrase the lost speaker kept from its turn (OwesPhrases):
        kept like a notice said while the speaker is lost, even if it is back
        by now, so that voice.speech.audio_loss says it (`speech/owed`),
        after the turn's own transcript line."""
        self.unsaid.append(Unsaid(text, time.time()))
        self._unsaid_wake()

    def unsaid_changed(self) -> anyio.Event:
        """The event set at the next notice kept, or when the speaker is back (armed before looking)."""
        if self._unsaid_changed is None:
            self._unsaid_changed = anyio.Event()
        return self._unsaid_changed

    def take_unsaid(self, older_than: float | None = None) -> list[Unsaid]:
        """The notices kept (those kept before `older_than`, a time.time()), no longer kept."""
        taken = [u for u in self.unsaid if older_than is None or u.at_wall <= older_than]
        self.unsaid = [u for u in self.unsaid if u not in taken]
        return taken

    def _unsaid_wake(self) -> None:
        changed, self._unsaid_changed = self._unsaid_changed, None
        if changed is not None:
            changed.set()

    def _heard_when_stopped(self, unit: _Unit, key) -> int:
        """A stopped unit's samples heard: after `stop()` what was handed
        over plays out; after `lose()` only what had left the speaker."""
        if unit.heard_to is None:
            return self.buffer.handed(key)
        span = self.buffer.span(key)
        return 0 if span is None else max(0, min(span[1] - span[0], unit.heard_to - span[0]))

    async def notice(self, text: str) -> None:
        """The assistant's own message (a timer, an error): written whole to
        the transcript, and its speakable head said aloud. While the speaker
        is lost it is kept instead (`unsaid`), for when it is back."""
        if self.speaker_lost:
            self.owe(text)
            return
        self.on_notice(text)
        spoken = spoken_notice(text)
        if not spoken:
            return
        self._notices += 1
        ref = UnitRef("notice", 0, 0, self._notices)
        self.open(ref)
        await self.text(ref, spoken)
        await self.close(ref)

    # -- from the pipeline -------------------------------------------------

    def is_current(self, ref: UnitRef) -> bool:
        unit = self._units.get(ref)
        return unit is not None and unit.current

    def play(self, sentence: Sentence, audio: SpeechAudio, synthesis: Synthesis | None = None) -> bool:
        """Queue a synthesized sentence for the speaker, unless its unit is no
        longer current (then it is late: logged and dropped)."""
        unit = self._units.get(sentence.ref)
        if unit is None or not unit.current:
            self.on_late("tts-audio", sentence.ref, {"sentence": sentence.index, "samples": len(audio.samples)})
            return False
        self.buffer.enqueue(sentence.key, audio.samples, self.play_at.get((sentence.ref.message_id, sentence.index)))
        # Keep what delivery needs (word timings, length), not the samples:
        # the buffer frees them once played.
        unit.audio[sentence.index] = _Said(audio.words, len(audio.samples), audio.method, synthesis)
        self._notify()
        return True

    def speaking_text(self) -> str:
        """What is being said aloud (the spoken form) of the replies still
        being spoken or queued (not the session's earlier replies, which have
        settled): the words the barge-in judge compares an echo with."""
        return " ".join(s.text for u in self._units.values() if u.current and not self._progress(u.ref)[1]
                        for s in u.sentences)

    def playing(self) -> bool:
        return self.buffer.pending()

    # -- internals ---------------------------------------------------------

    def _hand_on_sentences(self, unit: _Unit | None) -> None:
        """Where each sentence of a settled or stopped unit played, once."""
        if unit is None or unit.logged or not unit.sentences:
            return
        unit.logged = True
        bodies = []
        for s in unit.sentences:
            said = unit.audio.get(s.index)
            span = self.buffer.span(s.key)
            words = [[*self._source_span(unit.text, s, w), w.start, w.end] for w in (said.words if said else ())]
            timed = said.synthesis if said else None
            when = {} if timed is None else {"asked": timed.asked, "ready": timed.ready, "early": timed.early}
            bodies.append(SpeechSentence(
                message_id=unit.ref.message_id, index=s.index, char_start=s.char_start,
                char_end=s.spoken.source_end, start=span[0] if span else None,
                length=said.length if said else 0, handed=self.buffer.handed(s.key),
                method=said.method if said else "unsynthesized", words=words, **when))
        self.on_sentences(unit.ref, bodies)

    @staticmethod
    def _source_span(text: str, sentence: Sentence, word) -> tuple[int, int]:
        """The model's own characters a spoken word delivers (word timings are
        offsets in the spoken form): from the end of what the words before it
        delivered, less the space between, to the end of what it delivers.
        Empty for a word that delivers nothing alone ("three" of "3.5")."""
        start, end = sentence.delivered_chars(word.char_start), sentence.delivered_chars(word.char_end)
        between = text[start:end]
        return start + len(between) - len(between.lstrip()), end

    def _arm(self) -> anyio.Event:
        """The event the next change sets."""
        self._loop = asyncio.get_running_loop()
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def _notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def _buffer_changed(self) -> None:
        """From the playback buffer, in the audio callback's thread (live) or
        the loop's (replay)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._notify)

    async def _emit(self, unit: _Unit, spoken: list[SpokenSentence]) -> None:
        """Queue the stream's new sentences (all of them first, so a unit
        never looks settled while one is still on its way) and hand each to
        synthesis."""
        new = []
        for sentence in spoken:
            source = unit.text[sentence.source_start : sentence.source_end]
            lead = len(source) - len(source.lstrip())
            new.append(Sentence(unit.ref, len(unit.sentences) + len(new), sentence.text,
                                sentence.source_start + lead, sentence))
        unit.sentences += new
        if unit.unheard:
            return
        for sentence in new:
            await self.speak(sentence)
