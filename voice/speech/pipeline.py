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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import numpy as np
from pipecat.audio.vad.vad_analyzer import VADState
from pipecat.frames.frames import (
    DataFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from voice.audio.clock import run_blocking
from voice.audio.device import MIC_RATE
from voice.log.events import Body, ListenSpeech, ListenWake, ListenWindow
from voice.speech.barge_in import BargeInController
from voice.speech.early_speech import EarlySpeech
from voice.speech.listener import Addressed, ForAssistant, Ignored, Listener, WakeAlone
from voice.speech.onset import FRAME, MAX_LEAD_S, FrameScoringSilero, OnsetDetector
from voice.speech.stt import SttEngine, SttUnavailable, Transcript
from voice.speech.tts import SpeechAudio, TtsEngine
from voice.settings import TurnEndSettings
from voice.speech.turn_end import TurnEndTracker
from voice.speech.vad_gate import SoundGate, VadGate
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


class Speculation(Protocol):
    """Where the listener's early words go (voice.speech.turns.TurnRunner)."""

    def start_early(self, text: str) -> None: ...
    def drop_early(self) -> None: ...


class HeardWords(Protocol):
    """Where a finished utterance's words go (the session: an answer, a stop or a request)."""

    async def user_text(self, frame: UserTextFrame) -> None: ...


class LateSink(Protocol):
    """Where synthesis reports speech that came too late (voice.speech.speech_log)."""

    def late(self, kind: str, ref, info: dict) -> None: ...


class ListenProcessor(FrameProcessor):
    """VAD on the mic stream. An utterance ends after `stop_secs` of silence
    (the VAD's own rule; 1 s for one begun over the reply), or earlier when
    its speculative transcript is a complete request (voice.speech.turn_end);
    over the paused reply, words that are a stop confirm the barge-in after
    `end_s`, before the utterance ends.
    Smart-turn was measured unreliable on these voices and on read human
    speech (benchmarks/turn_end.py --smart-turn) and costs 55-95 ms per
    decision.

    Writes `listen/speech` as each stretch of speech ends and `listen/wake`
    when the wake word fires (mic positions): one row per utterance, never
    per block."""

    def __init__(self, vad, barge_in: BargeInController, speculation: Speculation, start_secs: float,
                 preroll_s: float = 0.5, transcript: Callable[[str], None] = lambda line: None,
                 aside: Callable[[str], None] | None = None,
                 wake=None, gate=None, stt: SttEngine | None = None, turn_end: TurnEndSettings | None = None,
                 stop_phrases: tuple[str, ...] = (), report_ignored: bool = False,
                 log: Callable[[Body, int | None], None] = lambda body, turn: None):
        super().__init__(name="listen")
        self._log = log  # listen/speech and listen/wake (voice.speech.speech_log)
        # -v: speech without the wake word is reported, so the VAD listens even where only the wake word must
        self._report_ignored = report_ignored
        # Without an STT engine (tests of the VAD alone) nothing is speculated.
        settings = turn_end or TurnEndSettings()
        self.turn_end = TurnEndTracker(settings if stt is not None else TurnEndSettings(enabled=False),
                                       lambda audio: asyncio.get_running_loop().run_in_executor(
                                           None, stt.transcribe, audio),
                                       MIC_RATE, stop_phrases)
        self._wake = wake  # a WakeWordDetector, in "wake" mode
        self.gate = gate  # a ListenGate: which finished utterances are for the assistant
        self._vad = vad
        self._barge_in = barge_in  # fed each block directly: it pauses, confirms or resumes the reply
        self._speculation = speculation
        self._transcript = transcript
        self._aside = aside  # -v: what was heard and not acted on
        # The decisions (voice.speech.listener); this processor runs the models and says what they said.
        self.listener = Listener(MIC_RATE, int(start_secs * MIC_RATE), int(preroll_s * MIC_RATE), FRAME,
                                 int(MAX_LEAD_S * MIC_RATE))
        self.muted = False
        scoring = isinstance(vad, FrameScoringSilero)
        self._onsets = OnsetDetector() if scoring else None
        self._vad_gate = VadGate() if scoring else None  # runs the VAD only when the moment needs it
        self._sound = SoundGate()  # whether the mic carries sound (the VAD and the wake word rest when not)
        self._state = VADState.QUIET  # the VAD's, after the last block
        self.heard_audio = anyio.Event()  # set at the first mic block: the service is listening
        self.blocks = self.vad_runs = self.wake_runs = 0  # mic blocks, and those each model ran on

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
        await self.release_vad()

    async def release_vad(self) -> None:
        """The VAD analyzer runs its model on a thread of its own, which
        outlives the session unless released. Idempotent."""
        await self._vad.cleanup()

    async def _listen(self, audio: bytes) -> None:
        li = self.listener
        n = len(audio) // 2
        end = li.position + n
        self.blocks += 1
        if self.muted:
            audio = bytes(len(audio))
        sound = self._sound.update(audio, end)
        if self._wake is not None and self._wake_word_in(audio, sound):
            wake_at = li.woke(n)
            self._log(ListenWake(position=wake_at, model=self._wake.model), None)
            self.gate.on_wake(wake_at / MIC_RATE)
            self._transcript("(okay: listening)")
        state = await self._vad_state(audio, n, sound)
        self.heard_audio.set()
        if self.gate is not None and li.assistant_stopped(self._barge_in.assistant_busy()):
            self.gate.on_assistant_stopped(end / MIC_RATE)  # the follow-up window opens
            self._log(ListenWindow(position=end), None)
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
            addressed = self._addressed(speech, end)
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
        addressed = self.gate is None or self.gate.accepts_utterance(li.onset / MIC_RATE)
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

    def _wake_word_in(self, audio: bytes, sound: bool) -> bool:
        """The wake-word detector on this block, only while the mic carries
        sound (voice.speech.vad_gate); over the pre-roll first when it starts
        again, so the model's context is the room's, not the last sound's."""
        if not sound:
            return False
        self.wake_runs += 1
        if self._sound.opened:
            for block in self.listener.preroll:
                self._wake.process(block)
        return self._wake.process(audio)

    async def _vad_state(self, audio: bytes, n: int, sound: bool) -> VADState:
        """The VAD's state after this block, running it only when the moment
        needs it (voice.speech.vad_gate); QUIET when it is off."""
        if self._vad_gate is None:
            self.vad_runs += 1
            return await self._vad.analyze_audio(audio)
        li = self.listener
        deciding = li.speaking or self._state != VADState.QUIET
        expected = (self.gate is None or self._report_ignored
                    or self.gate.expects_speech((li.position + n) / MIC_RATE))
        if not self._vad_gate.should_run(sound, deciding=deciding, busy=self._barge_in.assistant_busy(),
                                         expected=expected):
            self._state = VADState.QUIET
            return self._state
        if self._vad_gate.restarting:  # over the pre-roll first, on the frame grid it had
            restart = li.vad_restart()
            self._vad.restart(skipped=restart.skipped)
            self._onsets.reset()
            audio = restart.audio + audio
        li.fed_vad(n)
        self.vad_runs += 1
        self._state = await self._vad.analyze_audio(audio)
        return self._state

    def _pause_on_first_frames(self, n: int) -> None:
        """The acknowledgement from the first frames of speech (voice.speech.onset),
        before the analyzer's SPEAKING: a tentative pause that SPEAKING confirms."""
        if self._onsets is None:
            return
        li = self.listener
        onset = self._onsets.feed(self._vad.take_frames(), li.position + n)
        if onset is not None and not li.speaking:
            li.first_frames(onset, self._barge_in.first_frames(onset))

    def _addressed(self, audio: bytes, end: int) -> Addressed:
        """Whether the utterance is meant for the assistant (voice.speech.listener), told to the gate."""
        li = self.listener
        gated = self.gate is not None
        addressed = li.addressed(audio, end, gated=gated,
                                 accepted=gated and (li.barge_in or self.gate.accepts_utterance(li.onset / MIC_RATE)))
        if isinstance(addressed, Ignored):
            if self._aside is not None:
                self._aside(f"(ignored: {addressed.seconds:.1f} s of speech without the wake word)")
        elif isinstance(addressed, WakeAlone):
            self.gate.on_wake(end / MIC_RATE)
        elif gated:
            self.gate.consume()
        return addressed


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
    """Where the runtime meets the pipeline: user text goes out to it, its
    sentences come back in (`speak`) and flow on to synthesis."""

    def __init__(self, heard: HeardWords):
        super().__init__(name="converse")
        self._heard = heard

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, UserTextFrame):
            await self._heard.user_text(frame)
        else:
            await self.push_frame(frame, direction)

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
        job = self._early.claim(sentence.ref, sentence.index, sentence.text) if self._early is not None else None
        if job is None:
            job = asyncio.get_running_loop().run_in_executor(None, self._tts.synthesize, sentence.text)
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
        await self.push_frame(SpeechAudioFrame(sentence=sentence, audio=audio))


class PlayProcessor(FrameProcessor):
    def __init__(self, surface: VoiceSurface):
        super().__init__(name="play")
        self._surface = surface

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, SpeechAudioFrame):
            self._surface.play(frame.sentence, frame.audio)
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
