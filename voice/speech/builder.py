"""Wiring a voice session: VAD, wake word, processors, surface, agent,
barge-in control and the turn runner, around one device and the app
(voice.app.App: log, provider, tools, announcer).

Entry points call `build_voice_session` and then `session.run()`; nothing
here starts a task or opens a device.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipecat.audio.vad.vad_analyzer import VADParams

from voice.audio.device import MIC_RATE, AudioDevice
from voice.settings import Settings
from voice.speech.addressing import Addressing
from voice.speech.barge_in import BargeInController
from voice.speech.conversation_policy import ConversationPolicy
from voice.speech.early_speech import EarlySpeech
from voice.speech.judge import BargeInJudge
from voice.speech.listener import PREROLL_S, Listener
from voice.speech.onset import FRAME, MAX_LEAD_S, FrameScoringSilero
from voice.speech.pipeline import (
    ConverseProcessor,
    ListenProcessor,
    PlayProcessor,
    SpeakProcessor,
    TranscribeProcessor,
)
from voice.speech.session import SessionParts, VoiceSession
from voice.settings import VadSettings
from voice.speech.settings import VoiceSettings
from voice.speech.speech_log import SpeechLog, UnitRows
from voice.speech.stt import SttEngine
from voice.speech.tts import TtsEngine
from voice.speech.turn_end import TurnEndTracker
from voice.speech.turns import TurnRunner
from voice.speech.vad_gate import VoiceActivity
from voice.speech.voice_surface import VoiceSurface


@dataclass
class SpeechModels:
    """The loaded models a session speaks and listens with."""

    stt: SttEngine
    tts: TtsEngine
    echo: Any = None  # an EchoCanceller (voice.audio.echo), or None: no echo cancellation


def vad_analyzer(vad: VadSettings) -> FrameScoringSilero:
    analyzer = FrameScoringSilero(sample_rate=MIC_RATE, params=VADParams(
        confidence=vad.confidence, start_secs=vad.start_secs, stop_secs=vad.stop_secs, min_volume=vad.min_volume))
    analyzer.set_sample_rate(MIC_RATE)
    return analyzer


def listen_gate(settings: VoiceSettings):
    """(wake word detector, listen gate) for the settings' listen mode."""
    if settings.listen is None:
        return None, None
    from voice.audio.listening import ListenGate

    gate = ListenGate(settings.listen.mode, settings.listen.window_s)
    if settings.listen.mode != "wake":
        return None, gate
    from voice.audio.wakeword import WakeWordDetector

    return WakeWordDetector(settings.listen.wake_word), gate


def transcribe_in_executor(stt: SttEngine):
    """The end-of-turn tracker's recognition of the utterance so far: a job in the loop's executor."""

    def start(audio):
        return asyncio.get_running_loop().run_in_executor(None, stt.transcribe, audio)

    return start


def notice_line(transcript: Callable[[str], None]) -> Callable[[str], None]:
    """A notice to the person (a reply the surface could not say, words not
    heard) as a transcript line."""

    def line(text: str) -> None:
        transcript(f"notice: {text}")

    return line


def say_ignored(aside: Callable[[str], None] | None) -> Callable[[str], None]:
    """Something heard and not acted on, said as an aside (-v; else nothing)."""

    def ignored(why: str) -> None:
        if aside is not None:
            aside(f"(ignored: {why})")

    return ignored


def build_voice_session(app: Any, device: AudioDevice, models: SpeechModels, settings: VoiceSettings, *,
                        conversation: str, transcript: Callable[[str], None] = lambda line: print(line, flush=True),
                        aside: Callable[[str], None] | None = None, recorder: Any = None,
                        play_at: dict[tuple[str, int], int] | None = None, keep: int | None = 64,
                        keep_units: int | None = None) -> VoiceSession:
    """A session on `device`, answering in `conversation` with the app's
    provider and tools; `transcript` gets the lines a person reads, `aside`
    (with -v) what was heard and not acted on; `recorder` (a
    voice.audio.recording.Recorder) keeps the sound; `play_at` holds a replayed
    recording's sentences until where they played (VoiceSurface.play_at).
    `keep`: per-turn bookkeeping held for diagnostics, the newest turns' (None:
    all, for a finite replay's summary; a service keeps a bounded number and
    runs in flat memory); `keep_units`: the voice surface's units (messages)
    held, the newest (default: four a turn kept; all with `keep` None).

    Each part is made after the parts it needs and takes them in its
    constructor (tests/test_architecture.py checks that no function here is
    handed a part still to be made). The loop in the data (the person's
    words reach the agent, whose sentences come back through the pipeline)
    is cut at the converse stage's stream of words, which the session, made
    last, reads; the one hook set after construction is the agent's
    declared `before_turn_end`, for the barge-in controller that needs the
    agent."""
    store, buffer = app.store, device.buffer
    # The listener's decisions (a pure state machine): its mic position is where the speech log's rows lie.
    listener = Listener(MIC_RATE, int(settings.vad.start_secs * MIC_RATE), int(PREROLL_S * MIC_RATE), FRAME,
                        int(MAX_LEAD_S * MIC_RATE))
    unit_rows = UnitRows(store)  # speech/sentence and late/output, under each message's own conversation
    converse = ConverseProcessor()
    surface = VoiceSurface(buffer, speak=converse.speak, output_latency=device.output_latency,
                           on_late=unit_rows.late, on_notice=notice_line(transcript),
                           on_sentences=unit_rows.sentences, play_at=dict(play_at or {}),
                           keep=keep_units if keep_units is not None else None if keep is None else keep * 4)
    agent = app.agent(surface, conversation)
    log = SpeechLog(store, device, answering=agent, mic=listener)  # the rest of the speech side's rows
    conversations = ConversationPolicy(agent, store, settings.conversation, aside=aside)
    early_speech = EarlySpeech(models.tts)  # an early start's first sentence, synthesized before the commit
    turns = TurnRunner(agent, store, buffer, transcript=transcript, aside=aside, keep=keep,
                       conversations=conversations, notice=surface.notice, log=log, early_speech=early_speech)
    barge_in = BargeInController(
        BargeInJudge(settings.barge_in.confirm_ms, settings.barge_in.resume_ms), buffer, agent,
        log=log.speech, stop_phrases=settings.barge_in.stop_phrases, on_cut=turns.mark_cut,
        ignored=say_ignored(aside), speaking_text=surface.speaking_text)
    agent.before_turn_end = barge_in.turn_ending  # (declared hook) a pause still deciding ends before its turn
    wake, gate = listen_gate(settings)
    turn_end = TurnEndTracker(settings.turn_end, transcribe_in_executor(models.stt), MIC_RATE,
                              settings.barge_in.stop_phrases)
    # The listener feeds the barge-in controller and the turn runner's early start directly.
    listen = ListenProcessor(listener, VoiceActivity(vad_analyzer(settings.vad), listener),
                             Addressing(gate, wake, listener, log=log.speech, transcript=transcript, aside=aside),
                             turn_end, barge_in, turns, log=log.speech)
    parts = SessionParts(
        listen=listen, transcribe=TranscribeProcessor(models.stt, on_error=notice_line(transcript)),
        converse=converse, speak=SpeakProcessor(models.tts, surface, unit_rows, early_speech),
        play=PlayProcessor(surface), surface=surface, agent=agent, barge_in=barge_in, turns=turns, log=log)
    return VoiceSession(parts, store=store, device=device, settings=settings, stt_name=models.stt.name,
                        echo=models.echo, announcer=app.announcer, transcript=transcript, aside=aside,
                        recorder=recorder, sleep=app.sleep)


@functools.cache
def loaded_once(engine: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A speech model, loaded once per process for the same arguments. Whisper
    and Piper keep no state from one call to the next, so sessions opened one
    after another in one process (a benchmark's replays, the tests' in-process
    replays) share them: 2.5 s of CPU a session, measured. The echo canceller
    is not one of them: it learns the echo path, and starts fresh each session."""
    return engine(*args, **kwargs)


def load_models(settings: Settings, out_rate: int, *, stt_model: str | None = None,
                echo_cancellation: bool, echo_required: bool) -> SpeechModels:
    """Load the speech models of the settings' [stt] and [tts] (blocking,
    seconds, so an entry point runs it in a thread; progress on stderr). A
    missing model package is a UsageError naming the package. Without the
    echo canceller the service still runs (saying so: laptop speakers will
    cut replies short) unless `echo_required`."""
    import sys

    from voice.errors import UsageError
    from voice.speech.models import ModelMissing, load_with_progress
    from voice.speech.stt import RemoteSttEngine, WhisperEngine
    from voice.speech.tts import PiperEngine

    model = stt_model or settings.stt.model
    remote = settings.stt.base_url
    try:
        if remote:  # a recognition server (stt.base_url); a scenario's own model name then means nothing
            stt = RemoteSttEngine(remote, settings.stt.remote_model, settings.stt.timeout_s)
        else:
            stt = load_with_progress(f"speech recognition (whisper {model})",
                                     lambda: loaded_once(WhisperEngine, model, settings.stt.threads))
        tts = load_with_progress("speech synthesis (piper en_US-joe-medium)",
                                 lambda: loaded_once(PiperEngine, out_rate, alignments=settings.tts.alignments))
    except (ModelMissing, ValueError) as exc:
        raise UsageError(str(exc)) from None
    echo = None
    if echo_cancellation:
        from voice.audio.echo import EchoCanceller, EchoUnavailable

        try:
            echo = EchoCanceller()
        except EchoUnavailable as exc:
            if echo_required:
                raise UsageError(str(exc)) from None
            print(f"voice: warning: {exc}; use a headset", file=sys.stderr, flush=True)
    return SpeechModels(stt, tts, echo)
