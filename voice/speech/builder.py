"""Wiring a voice session: VAD, wake word, processors, surface, agent,
barge-in control and the turn runner, around one device and the app
(voice.app.App: log, provider, tools, announcer).

Entry points call `build_voice_session` and then `session.run()`; nothing
here starts a task or opens a device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipecat.audio.vad.vad_analyzer import VADParams

from voice.audio.device import MIC_RATE, AudioDevice
from voice.settings import Settings
from voice.speech.barge_in import BargeInController
from voice.speech.conversation_policy import ConversationPolicy
from voice.speech.early_speech import EarlySpeech
from voice.speech.judge import BargeInJudge
from voice.speech.onset import FrameScoringSilero
from voice.speech.pipeline import (
    ConverseProcessor,
    ListenProcessor,
    PlayProcessor,
    SpeakProcessor,
    TranscribeProcessor,
)
from voice.speech.session import SessionParts, VoiceSession, interruption
from voice.settings import VadSettings
from voice.speech.settings import VoiceSettings
from voice.speech.speech_log import SpeechLog
from voice.speech.stt import SttEngine
from voice.speech.tts import TtsEngine
from voice.speech.turns import TurnRunner
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
    held, the newest (default: four a turn kept; all with `keep` None)."""
    session = VoiceSession(store=app.store, device=device, settings=settings, stt_name=models.stt.name,
                           echo=models.echo, announcer=app.announcer, transcript=transcript, aside=aside,
                           recorder=recorder, sleep=app.sleep)
    # The one writer of the speech side's rows; it reads the agent's conversation and the
    # listener's position at each write (both are made below).
    log = SpeechLog(app.store, device, conversation=lambda: agent.conversation, mic_position=lambda: listen.position)
    converse = ConverseProcessor(session)
    surface = VoiceSurface(device.buffer, speak=converse.speak, output_latency=device.output_latency,
                           on_late=log.late, on_notice=lambda text: transcript(f"notice: {text}"),
                           on_sentences=log.sentences, play_at=dict(play_at or {}),
                           keep=keep_units if keep_units is not None else None if keep is None else keep * 4)
    agent = app.agent(surface, conversation)
    conversations = ConversationPolicy(agent, app.store, settings.conversation, aside=aside)
    early_speech = EarlySpeech(models.tts)  # an early start's first sentence, synthesized before the commit
    turns = TurnRunner(agent, app.store, device.buffer, transcript=transcript, aside=aside, keep=keep,
                       conversations=conversations, notice=surface.notice, log=log, early_speech=early_speech)
    barge_in = BargeInController(
        BargeInJudge(settings.barge_in.confirm_ms, settings.barge_in.resume_ms), device.buffer, agent,
        log=log.speech, stop_phrases=settings.barge_in.stop_phrases,
        interrupt_pipeline=interruption(lambda: listen), on_cut=turns.mark_cut, ignored=session.ignored,
        speaking_text=surface.speaking_text)
    agent.before_turn_end = barge_in.turn_ending  # a pause still deciding ends before its turn
    wake, gate = listen_gate(settings)
    # The listener feeds the barge-in controller and the turn runner's early start directly.
    listen = ListenProcessor(vad_analyzer(settings.vad), barge_in, turns, start_secs=settings.vad.start_secs,
                             transcript=transcript, aside=aside, wake=wake, gate=gate, stt=models.stt,
                             turn_end=settings.turn_end, stop_phrases=settings.barge_in.stop_phrases,
                             report_ignored=aside is not None, log=log.speech)
    session.wire(SessionParts(
        listen=listen, transcribe=TranscribeProcessor(models.stt, on_error=lambda why: transcript(f"notice: {why}")),
        converse=converse,
        speak=SpeakProcessor(models.tts, surface, log, early_speech), play=PlayProcessor(surface),
        surface=surface, agent=agent, barge_in=barge_in, turns=turns, log=log))
    return session


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
                                     lambda: WhisperEngine(model, settings.stt.threads))
        tts = load_with_progress("speech synthesis (piper en_US-joe-medium)",
                                 lambda: PiperEngine(out_rate, alignments=settings.tts.alignments))
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
