"""The voice surface: the agent loop's text becomes queued sentences, each
sentence becomes audio with word timings, and `delivered()` reports the
words whose audio has fully come out of the speaker.

Delivered while playing = samples handed to the device minus its output
latency. After `stop()` the buffer is cleared in the device callback, and
what had already been handed over will still play, so delivered = handed.

Units (assistant messages) are keyed by `UnitRef`; a unit that was stopped
or discarded is no longer current, and audio that arrives for it later is
dropped and logged as late (`late/output`).

Waiting (`wait_delivered`, `stop`) is driven by the playback buffer's
notifications (a chunk started or finished, a clear, a pause or resume;
sent from the audio callback's thread) and by the surface's own changes;
the only timed wait is for the device's output latency to pass once the
last sample was handed over, computed from that latency.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from voice.agent.surface import Delivered, UnitRef
from voice.audio.playback import PlaybackBuffer
from voice.speech.clauses import first_clause_end
from voice.speech.tts import SpeechAudio

# A sentence ends at ., ! or ? (with closing quotes/brackets) before whitespace, or at a line break.
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*\s+|\n+")
# What is never read aloud: URLs, paths, config keys and markup.
_UNSPEAKABLE = re.compile(r"\S*(?:://|/|\\|~|`|\*|_|#)\S*")


def spoken_notice(text: str) -> str:
    """What of a notice is said aloud: its head (before the first ": ", the
    detail is for the transcript), without paths, URLs or markup."""
    head, detail, _ = text.partition(": ")
    spoken = " ".join(_UNSPEAKABLE.sub("", head).split())
    if detail:  # the head ends where the detail began: end it as a sentence
        spoken = spoken.rstrip(" .,;:") + "." if spoken.strip(" .,;:") else ""
    return spoken[:1].upper() + spoken[1:]


@dataclass(frozen=True)
class Sentence:
    ref: UnitRef
    index: int
    text: str
    char_start: int  # in the unit's text

    @property
    def key(self) -> tuple[UnitRef, int]:
        return (self.ref, self.index)


@dataclass(frozen=True)
class _Said:
    """A synthesized sentence as delivery sees it."""

    words: tuple
    length: int
    method: str


@dataclass
class _Unit:
    ref: UnitRef
    text: str = ""
    cut: int = 0  # text before this offset has been split into sentences
    sentences: list[Sentence] = field(default_factory=list)
    audio: dict[int, _Said] = field(default_factory=dict)
    closed: bool = False
    current: bool = True
    stopped: bool = False


@dataclass
class VoiceSurface:
    buffer: PlaybackBuffer
    speak: Callable[[Sentence], Awaitable[None]]  # hands a sentence to synthesis
    output_latency: Callable[[], int] = lambda: 0  # samples, as the device reports
    on_late: Callable[[str, UnitRef, dict], None] = lambda kind, ref, info: None
    on_notice: Callable[[str], None] = lambda text: None  # the whole notice, for the transcript
    tracks_playback: bool = True
    _units: dict[UnitRef, _Unit] = field(default_factory=dict)
    _changed: anyio.Event | None = None  # set (and dropped) at the next change of what plays
    _loop: asyncio.AbstractEventLoop | None = None

    def __post_init__(self) -> None:
        self.buffer.subscribe(self._buffer_changed)

    # -- Surface -----------------------------------------------------------

    def open(self, ref: UnitRef) -> None:
        self._units[ref] = _Unit(ref)

    async def text(self, ref: UnitRef, text: str) -> None:
        unit = self._units[ref]
        unit.text += text
        if not unit.sentences and (end := first_clause_end(unit.text, unit.cut)) is not None:
            await self._emit(unit, end)  # first audio sooner (voice.speech.clauses)
        while (m := _SENTENCE_END.search(unit.text, unit.cut)) is not None:
            await self._emit(unit, m.end())

    async def reasoning(self, ref: UnitRef, text: str) -> None:
        return None  # reasoning is not spoken, so it is never delivered

    async def close(self, ref: UnitRef) -> None:
        """Speak what is left after the last sentence end."""
        unit = self._units[ref]
        unit.closed = True
        if unit.text[unit.cut :].strip():
            await self._emit(unit, len(unit.text))
        unit.cut = len(unit.text)
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
            heard = self.buffer.handed(s.key) if unit.stopped else self.buffer.heard(s.key, latency)
            samples += heard
            played_words = [w for w in audio.words if w.end <= heard]
            if not unsaid:  # the delivered prefix stops at the first sentence that was not said
                words += len(played_words)
                if played_words:
                    chars = s.char_start + played_words[-1].char_end
            if heard < audio.length:
                settled = False
                if self.buffer.handed(s.key) == audio.length and not self.buffer.paused:
                    due_s = (audio.length - heard) / self.buffer.rate  # in the device, on its way out
                break
        settled = settled and unit.closed and unit.cut >= len(unit.text.rstrip())
        complete = settled and not unsaid
        if complete:
            chars = len(unit.text)
        return Delivered(text_chars=chars, words=words, samples=samples, complete=complete), settled, due_s

    async def wait_delivered(self, ref: UnitRef) -> Delivered:
        while True:
            changed = self._arm()  # before looking: a change from now on sets it
            delivered, settled, due_s = self._progress(ref)
            if settled:
                return delivered
            with anyio.move_on_after(due_s if due_s is not None else float("inf")):
                await changed.wait()

    async def stop(self) -> None:
        for unit in self._units.values():
            if unit.current:
                unit.current, unit.stopped = False, True
        done = len(self.buffer.clears)
        self.buffer.request_clear()
        with anyio.move_on_after(0.5):  # the device performs the clear at its next block
            while len(self.buffer.clears) == done:
                await self._arm().wait()

    async def notice(self, text: str) -> None:
        """The assistant's own message (a timer, an error): written whole to
        the transcript, and its speakable head said aloud."""
        self.on_notice(text)
        spoken = spoken_notice(text)
        if not spoken:
            return
        ref = UnitRef("notice", 0, 0, len(self._units))
        self.open(ref)
        await self.text(ref, spoken)
        await self.close(ref)

    # -- from the pipeline -------------------------------------------------

    def is_current(self, ref: UnitRef) -> bool:
        unit = self._units.get(ref)
        return unit is not None and unit.current

    def play(self, sentence: Sentence, audio: SpeechAudio) -> bool:
        """Queue a synthesized sentence for the speaker, unless its unit is no
        longer current (then it is late: logged and dropped)."""
        unit = self._units.get(sentence.ref)
        if unit is None or not unit.current:
            self.on_late("tts-audio", sentence.ref, {"sentence": sentence.index, "samples": len(audio.samples)})
            return False
        self.buffer.enqueue(sentence.key, audio.samples)
        # Keep what delivery needs (word timings, length), not the samples:
        # the buffer frees them once played.
        unit.audio[sentence.index] = _Said(audio.words, len(audio.samples), audio.method)
        self._notify()
        return True

    def speaking_text(self) -> str:
        """The text of the replies still being spoken or queued (not the
        session's earlier replies, which have settled)."""
        return " ".join(u.text for u in self._units.values() if u.current and not self._progress(u.ref)[1])

    def playing(self) -> bool:
        return self.buffer.pending()

    # -- internals ---------------------------------------------------------

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

    async def _emit(self, unit: _Unit, end: int) -> None:
        start = unit.cut
        unit.cut = end
        raw = unit.text[start:end]
        lead = len(raw) - len(raw.lstrip())
        sentence = Sentence(unit.ref, len(unit.sentences), raw.strip(), start + lead)
        if not sentence.text:
            return
        unit.sentences.append(sentence)
        await self.speak(sentence)
