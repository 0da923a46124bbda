"""The pipecat pipeline of the voice surface:

    listen (Silero VAD; end of turn: speech/turn_end) -> transcribe (faster-whisper)
    -> converse (hands text to the runtime) -> speak (piper) -> play (buffer)

Our own frames carry sample positions (16 kHz mic clock) and unit refs. A
barge-in pushes pipecat's `InterruptionFrame`, which cancels each
processor's current work and flushes its queue (queued sentences never get
synthesized); the runtime cancels the turn itself and the player buffer is
cleared in the device callback. Inference runs in the loop's executor, where
the replay clock counts it as in flight.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import numpy as np
from pipecat.audio.vad.vad_analyzer import VADState
from pipecat.frames.frames import (
    DataFrame,
    EndFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from voice.audio.clock import run_blocking
from voice.audio.device import MIC_RATE
from voice.log.events import Body, ListenSpeech
from voice.speech.addressing import Addressing
from voice.speech.barge_in import BargeInController
from voice.speech.early_speech import EarlySpeech
from voice.speech.listener import ForAssistant, Listener
from voice.speech.stt import SttEngine, SttUnavailable, Transcript
from voice.speech.tts import SpeechAudio, Synthesis, TtsEngine
from voice.speech.turn_end import TurnEndTracker
from voice.speech.vad_gate import SoundGate, VoiceActivity
from voice.speech.voice_surface import Sentence, VoiceSurface


@dataclass
class UtteranceFrame(DataFrame):
    """The person's utterance. It and its words (`UserTextFrame`) are never
    dropped by an interruption (pipecat's InterruptionFrame cancels what a
    stage is doing): a barge-in stops the assistant, and the words that
    made it are still to be judged."""

    interruptible: bool = field(default=False, init=False)
    audio: bytes  # int16 mono 16 kHz, with pre-roll, to `speculate_s` after its last voiced block
    start: int  # mic sample position of the speech onset (estimated)
    end: int  # mic sample position where the end of turn was decided
    # The speculative recognition of exactly this audio (voice.speech.turn_end):
    # its transcript, or its job still running; None: transcribe it now.
    transcript: Transcript | None = None
    pending: asyncio.Future | None = None


@dataclass
class UserTextFrame(DataFrame):
    interruptible: bool = field(default=False, init=False)
    text: str
    start: int
    end: int
    stt_s: float
    doubtful: bool = False  # Whisper's guess at a sound (see voice.speech.stt)


@dataclass
class SpeakFrame(DataFrame):
    sentence: Sentence


@dataclass
class SpeechAudioFrame(DataFrame):
    sentence: Sentence
    audio: SpeechAudio
    synthesis: Synthesis | None = None  # when it was asked for and ready


class Speculation(Protocol):
    """Where the listener's early words go (voice.speech.turns.TurnRunner)."""

    def start_early(self, text: str) -> None: ...
    def drop_early(self) -> None: ...


class LateSink(Protocol):
    """Where synthesis reports speech that came too late (voice.speech.speech_log)."""

    def late(self, kind: str, ref, info: dict) -> None: ...


class ListenProcessor(FrameProcessor):
    """The mic stream, block by block, through the listener's parts: the
    sound gate, whom speech is for (`Addressing`: the wake word, the
    follow-up window, the finished utterance), the VAD (`VoiceActivity`),
    the barge-in controller (fed each block directly: it pauses, confirms
    or resumes the reply) and the end of turn (`TurnEndTracker`, whose
    early words go to `speculation`). The decisions are the `Listener`'s
    (a pure state machine); this processor runs the parts in order and
    pushes what they decided as frames.

    An utterance ends after `stop_secs` of silence (the VAD's own rule; 1 s
    for one begun over the reply), or earlier when its speculative
    transcript is a complete request (voice.speech.turn_end); over the
    paused reply, words that are a stop confirm the barge-in after `end_s`,
    before the utterance ends. Smart-turn was measured unreliable on these
    voices and on read human speech (benchmarks/turn_end.py --smart-turn)
    and costs 55-95 ms per decision.

    Writes `listen/speech` as each stretch of speech ends (mic positions):
    one row per utterance, never per block."""

    def __init__(self, listener: Listener, activity: VoiceActivity, addressing: Addressing,
                 turn_end: TurnEndTracker, barge_in: BargeInController, speculation: Speculation, *,
                 log: Callable[[Body, int | None], None]):
        super().__init__(name="listen")
        self.listener = listener
        self.activity = activity
        self.addressing = addressing
        self.turn_end = turn_end
        self._barge_in = barge_in
        self._speculation = speculation
        self._log = log  # listen/speech (voice.speech.speech_log)
        self.muted = False
        self._sound = SoundGate()  # whether the mic carries sound (the VAD and the wake word rest when not)
        self.heard_audio = anyio.Event()  # set at the first mic block: the service is listening
        self.blocks = 0  # mic blocks
        self._breaks: list[int] = []  # mic positions where the audio broke off (a lost sound card), oldest first

    def broke_off(self, at: int) -> None:
        """The sound card was lost after the mic's first `at` samples: the
        block that follows them does not follow on from them. Words that were
        being said are cut off there; they are not a request of their own, and
        are not joined to what is said once the mic is back (heard as "What
        time? What time is it?" before): the utterance ends at the break,
        written down as speech not for the assistant, and nothing of it or of
        its pre-roll carries over. Called from outside the pipeline; taken at
        the first block from `at` on (the blocks before it may still be on
        their way)."""
        self._breaks.append(at)

    position = property(lambda self: self.listener.position)
    speaking = property(lambda self: self.listener.speaking)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InputAudioRawFrame):
            await self._listen(frame.audio)
        else:
            await self.push_frame(frame, direction)

    async def cleanup(self) -> None:
        """At the pipeline's teardown."""
        await super().cleanup()
        await self.activity.release()

    async def _listen(self, audio: bytes) -> None:
        li = self.listener
        n = len(audio) // 2
        end = li.position + n
        self.blocks += 1
        if self._breaks and li.position >= self._breaks[0]:
            del self._breaks[:bisect.bisect_right(self._breaks, li.position)]
            await self._drop_cut_off()
        if self.muted:
            audio = bytes(len(audio))
        sound = self._sound.update(audio, end)
        self.addressing.wake_word(audio, n, sound, self._sound.opened)
        state = await self.activity.state(audio, n, sound, busy=self._barge_in.assistant_busy(),
                                          expected=self.addressing.expects_speech(li.position + n))
        self.heard_audio.set()
        self.addressing.window(end, self._barge_in.assistant_busy())
        voiced = state in (VADState.STARTING, VADState.SPEAKING)
        li.heard(audio, voiced)
        self._pause_on_first_frames(n)
        if not li.speaking and state == VADState.SPEAKING:
            onset = li.start_utterance(n)
            await self.push_frame(UserStartedSpeakingFrame())
            li.barge_in = self._barge_in.onset(onset)  # over the assistant: it paused, and needs no wake word
            self.turn_end.reset(over_reply=li.barge_in)
        # The end-of-turn tracker sees every block of the utterance (its voiced
        # blocks are the audio recognised), the one that confirms a barge-in too.
        ended = li.speaking and (self._complete_turn(n, voiced)
                                 or (state == VADState.QUIET and not self.turn_end.holds_open()))
        # A pending barge-in (output paused) is confirmed or resumed as audio comes in,
        # or confirmed by the words so far when they are a stop.
        if self._barge_in.block(n, voiced, end, li.speaking) or self._stop_heard():
            await self.push_frame(InterruptionFrame())
        elif ended:
            speech = self.turn_end.speech(li.end_utterance())
            await self.push_frame(UserStoppedSpeakingFrame())
            addressed = self.addressing.addressed(speech, end)
            for_assistant = isinstance(addressed, ForAssistant)
            self._log(ListenSpeech(start=li.onset, end=max(li.onset, li.voiced_end), decided=end,
                                   for_assistant=for_assistant), None)
            if for_assistant:
                self._barge_in.utterance_ended(li.onset)  # its words are on their way
                frame = UtteranceFrame(audio=addressed.audio, start=li.onset, end=end)
                if addressed.skipped == self.turn_end.skipped:  # the speculation is of exactly this audio
                    frame.transcript, frame.pending = self.turn_end.final()
                await self.push_frame(frame)
            if li.end_speculation(dropped=not for_assistant):
                self._speculation.drop_early()
            self.turn_end.abandon()
        li.advance(n)

    async def _drop_cut_off(self) -> None:
        """At a break (`broke_off`): the utterance going on is over, heard by no one."""
        li = self.listener
        li.broke_off()
        self.activity.broke_off()
        if not li.speaking:
            return
        li.end_utterance()
        await self.push_frame(UserStoppedSpeakingFrame())
        self._log(ListenSpeech(start=li.onset, end=max(li.onset, li.voiced_end), decided=li.position,
                               for_assistant=False), None)
        if li.end_speculation(dropped=True):
            self._speculation.drop_early()
        self.turn_end.abandon()

    def _complete_turn(self, samples: int, voiced: bool) -> bool:
        """The end-of-turn hook: speculation at short pauses (only while the
        assistant is silent: the cores are its while it speaks), and an
        early end when the utterance so far is a complete request."""
        li = self.listener
        idle = not self._barge_in.assistant_busy()
        # Over the paused reply the words so far are recognised too, for a stop
        # (`_stop_heard`); they never end the utterance early: it waits OVER_REPLY_END_S.
        deciding = li.barge_in and self._barge_in.deciding(li.onset)
        end = self.turn_end.block(li.utterance, samples, voiced, may_speculate=idle or deciding,
                                  skip=li.addressed_from(li.position + samples)) and not deciding
        # Words not (yet) addressed to the assistant never reach the model early (wake mode).
        addressed = self.addressing.accepts(li.onset)
        text = self.turn_end.complete_request() if idle and addressed else None
        if li.speculate(text):  # the model may start on these words (voice.agent.preempt), or stop
            if li.speculated is None:
                self._speculation.drop_early()  # they went on
            else:
                self._speculation.start_early(li.speculated)
        return end

    def _stop_heard(self) -> bool:
        """The utterance that paused the reply is, so far, a stop and nothing
        more, and the person paused: the barge-in is confirmed now (True)."""
        li = self.listener
        if not (li.speaking and li.barge_in):
            return False
        text = self.turn_end.stop_heard()
        return text is not None and self._barge_in.stop_heard(li.onset, text)

    def _pause_on_first_frames(self, n: int) -> None:
        """The acknowledgement from the first frames of speech (voice.speech.onset),
        before the analyzer's SPEAKING: a tentative pause that SPEAKING confirms."""
        li = self.listener
        onset = self.activity.first_frames(li.position + n)
        if onset is not None and not li.speaking:
            li.first_frames(onset, self._barge_in.first_frames(onset))


class TranscribeProcessor(FrameProcessor):
    def __init__(self, stt: SttEngine, on_error: Callable[[str], None] = lambda why: None):
        super().__init__(name="transcribe")
        self._stt = stt
        self._on_error = on_error  # the person is told when words could not be recognised
        self.busy = False

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, UtteranceFrame):
            self.busy = True
            try:
                result, after_end = await self._recognise(frame)
            except SttUnavailable as exc:
                self._on_error(f"not heard: {exc}")
                return
            finally:
                self.busy = False
            # Even no words are news: a sound that paused the reply is then
            # judged at once instead of after the judge's resume timeout.
            await self.push_frame(UserTextFrame(text=result.text.strip(), start=frame.start, end=frame.end,
                                                stt_s=after_end, doubtful=result.doubtful))
        else:
            await self.push_frame(frame, direction)

    async def _recognise(self, frame: UtteranceFrame) -> tuple[Transcript, float]:
        """The utterance's transcript and the recognition time it cost after
        the end of turn: none when the speculation already has it, the rest
        of its run when it is on its way, else a whole recognition."""
        if frame.transcript is not None:
            return frame.transcript, 0.0
        if frame.pending is not None:
            waited = time.monotonic()
            try:
                return await asyncio.shield(frame.pending), time.monotonic() - waited
            except Exception:  # noqa: BLE001 - the speculation failed: recognise afresh, which raises it again
                pass
        audio = np.frombuffer(frame.audio, np.int16).astype(np.float32) / 32768.0
        result = await run_blocking(self._stt.transcribe, audio)
        return result, result.seconds


class ConverseProcessor(FrameProcessor):
    """Where the runtime meets the pipeline: the person's words go out to it
    (`words`, in the order they were heard; the session reads them), its
    sentences come back in (`speak`) and flow on to synthesis.

    The words go through a stream, not a call: the session that reads them
    is made from the parts the agent needs, and the agent speaks through
    this processor (`speak`), so this processor is made first and knows no
    reader. Words never wait here, so an interruption passing through finds
    no words of the person's to drop. The stream ends with the pipeline
    (its EndFrame, after every word before it): a draining session reads
    the words that were still on their way to its end."""

    def __init__(self):
        super().__init__(name="converse")
        # Unbounded: a person's utterances, each ended by a pause, are few; the reader takes them in order.
        self._heard, self.words = anyio.create_memory_object_stream[UserTextFrame](math.inf)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, UserTextFrame):
            self._heard.send_nowait(frame)
            return
        if isinstance(frame, EndFrame):
            self._heard.close()
        await self.push_frame(frame, direction)

    async def cleanup(self) -> None:
        """At the pipeline's teardown (also one cut short before its EndFrame)."""
        await super().cleanup()
        self._heard.close()

    async def speak(self, sentence: Sentence) -> None:
        await self.push_frame(SpeakFrame(sentence=sentence))


class SpeakProcessor(FrameProcessor):
    """Synthesizes one sentence at a time. A sentence whose unit is no longer
    current is not synthesized; audio that finishes after its unit was
    stopped is discarded and logged as late. A turn's first sentence may
    already be synthesized, or on its way, from its early start
    (voice.speech.early_speech)."""

    def __init__(self, tts: TtsEngine, surface: VoiceSurface, late: LateSink, early: EarlySpeech | None = None):
        super().__init__(name="speak")
        self._tts = tts
        self._surface = surface
        self._late = late
        self._early = early  # the early start's first sentence, synthesized before the commit
        self.busy = False

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, SpeakFrame):
            await self.push_frame(frame, direction)
            return
        sentence = frame.sentence
        if not self._surface.is_current(sentence.ref):
            self._late.late("tts-text", sentence.ref, {"sentence": sentence.index})
            return
        synthesis = self._early.claim(sentence.ref, sentence.index, sentence.text) if self._early is not None else None
        if synthesis is None:
            synthesis = Synthesis.start(self._tts, sentence.text)
        job = synthesis.job
        self.busy = True
        try:
            audio = await asyncio.shield(job)
        except Exception as exc:  # a sentence piper cannot say is skipped, never waited for
            self._late.late("tts-failed", sentence.ref, {"sentence": sentence.index, "error": repr(exc)})
            audio = SpeechAudio(np.zeros(0, np.int16), self._tts.rate, (), "failed", 0.0)
        except asyncio.CancelledError:
            # Interrupted: the synthesis thread finishes on its own and its audio
            # is never used. Recorded now, while the turn's log is current; the
            # job's own outcome is only collected, never acted on.
            self._late.late("tts-audio", sentence.ref, {"sentence": sentence.index})
            job.add_done_callback(_collect)
            raise
        finally:
            self.busy = False
        await self.push_frame(SpeechAudioFrame(sentence=sentence, audio=audio, synthesis=synthesis))


class PlayProcessor(FrameProcessor):
    def __init__(self, surface: VoiceSurface):
        super().__init__(name="play")
        self._surface = surface

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, SpeechAudioFrame):
            self._surface.play(frame.sentence, frame.audio, frame.synthesis)
        elif isinstance(frame, InterruptionFrame):
            self._surface.buffer.request_clear()
            await self.push_frame(frame, direction)
        else:
            await self.push_frame(frame, direction)


def _collect(job: asyncio.Future) -> None:
    """Retrieve an abandoned job's outcome (so no 'exception was never
    retrieved' is logged); nothing else happens with it."""
    if not job.cancelled():
        job.exception()
