"""A voice session: one audio device, the pipecat pipeline, and the runtime.

It owns a task group with three children: the pipecat worker, the device
(which feeds mic blocks in and pulls speaker blocks out), and the turn
runner (which takes recognised utterances one at a time to the agent loop).
A barge-in (speech onset while the assistant has a turn running or audio
playing) cancels the turn, pushes an `InterruptionFrame` and clears the
speaker buffer in the device callback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADParams
from pipecat.frames.frames import EndFrame, InputAudioRawFrame, InterruptionFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.workers.runner import WorkerRunner

from voice.agent.loop import AgentLoop, LoopSettings, ToolEnv
from voice.agent.providers.base import Provider
from voice.agent.surface import UnitRef
from voice.agent.tools import ToolRegistry
from voice.audio.device import MIC_RATE, AudioDevice
from voice.log import events as ev
from voice.log.projections import turn_reply
from voice.log.store import EventStore
from voice.speech.pipeline import (
    ConverseProcessor,
    ListenProcessor,
    PlayProcessor,
    SpeakProcessor,
    TranscribeProcessor,
    UserTextFrame,
)
from voice.speech.barge_in import BargeInJudge
from voice.speech.stt import SttEngine
from voice.speech.surface import VoiceSurface
from voice.speech.tts import TtsEngine


@dataclass(frozen=True)
class VadSettings:
    confidence: float = 0.7
    start_secs: float = 0.05
    stop_secs: float = 0.6
    min_volume: float = 0.4


@dataclass(frozen=True)
class BargeInSettings:
    confirm_ms: float = 500.0
    resume_ms: float = 2000.0


@dataclass(frozen=True)
class ListenSettings:
    mode: str = "wake"  # "wake": a wake word (or the conversation window) first; "open": everything
    wake_word: str = "okay_nabu"
    window_s: float = 8.0


@dataclass
class _Request:
    """An utterance (or typed text) waiting for its turn."""

    text: str
    source: str
    start: int
    end: int
    stt_s: float
    done: anyio.Event | None = None
    result: Any = None


@dataclass
class TurnInfo:
    turn: int
    user_text: str
    utterance_start: int  # mic samples
    utterance_end: int
    stt_s: float
    text_ready_at: float  # loop time when the transcript reached the runtime
    barge_in_onset: int | None = None  # VAD onset of the speech that stopped it
    clear_position: int | None = None


@dataclass
class VoiceSession:
    store: EventStore
    provider: Provider
    tools: ToolRegistry
    settings: LoopSettings
    conversation: str
    device: AudioDevice
    stt: SttEngine
    tts: TtsEngine
    vad: VadSettings = field(default_factory=VadSettings)
    tool_env: ToolEnv | None = None
    shutdown_s: float = 5.0
    echo: Any = None  # an EchoCanceller, applied to the mic before the VAD
    barge_in: "BargeInSettings" = field(default_factory=lambda: BargeInSettings())
    listen_mode: "ListenSettings | None" = None  # None: open, with no gate at all
    timers: Any = None  # a TimerService, announced through this session's voice
    transcript: Callable[[str], None] = lambda line: print(line, flush=True)
    turns: list[TurnInfo] = field(default_factory=list)
    agent: AgentLoop = field(init=False)
    surface: VoiceSurface = field(init=False)

    def __post_init__(self) -> None:
        analyzer = SileroVADAnalyzer(sample_rate=MIC_RATE, params=VADParams(
            confidence=self.vad.confidence, start_secs=self.vad.start_secs,
            stop_secs=self.vad.stop_secs, min_volume=self.vad.min_volume))
        analyzer.set_sample_rate(MIC_RATE)
        wake = gate = None
        if self.listen_mode is not None:
            from voice.audio.listening import ListenGate

            gate = ListenGate(self.listen_mode.mode, self.listen_mode.window_s)
            if self.listen_mode.mode == "wake":
                from voice.audio.wakeword import WakeWordDetector

                wake = WakeWordDetector(self.listen_mode.wake_word)
        self.listen = ListenProcessor(analyzer, self, start_secs=self.vad.start_secs, wake=wake, gate=gate)
        self.transcribe = TranscribeProcessor(self.stt)
        self.converse = ConverseProcessor(self)
        self.surface = VoiceSurface(self.device.buffer, speak=self.converse.speak,
                                    output_latency=self.device.output_latency, on_late=self.late)
        self.speak = SpeakProcessor(self.tts, self.surface, self)
        self.play = PlayProcessor(self.surface)
        self.agent = AgentLoop(self.store, self.provider, self.surface, self.conversation, self.tools, self.settings,
                               self.tool_env)
        self._send, self._receive = anyio.create_memory_object_stream[_Request](16)
        self.judge = BargeInJudge(self.barge_in.confirm_ms, self.barge_in.resume_ms)
        self._pause_turn: int | None = None
        self._waiting = 0  # utterances recognised but whose turn has not ended

    # -- lifecycle ---------------------------------------------------------

    async def run(self) -> None:
        """Run until the device ends (replay) or the caller cancels (live)."""
        worker = PipelineWorker(
            Pipeline([self.listen, self.transcribe, self.converse, self.speak, self.play]),
            enable_rtvi=False, idle_timeout_secs=None, cancel_on_idle_timeout=False,
            params=PipelineParams(audio_in_sample_rate=MIC_RATE, audio_out_sample_rate=self.device.out_rate),
        )
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)

        async def on_mic(block: bytes, reference: bytes) -> None:
            if self.echo is not None:
                block = self.echo.process(block, reference)
                if not block:
                    return
            await worker.queue_frame(InputAudioRawFrame(audio=block, sample_rate=MIC_RATE, num_channels=1))

        runner_done = anyio.Event()

        async def run_pipeline() -> None:
            try:
                await runner.run()
            finally:
                runner_done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_pipeline)
            tg.start_soon(self._run_turns)
            if self.timers is not None:
                tg.start_soon(self.timers.run)
            try:
                await self.device.run(on_mic)
            finally:
                # Stop the turn (its prefix is recorded), then let the EndFrame
                # drain the pipeline so pipecat closes its own tasks.
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.shutdown_s):
                    self.agent.cancel(ev.INTERRUPTED)
                    while self.agent.busy:
                        await anyio.sleep(0.01)
                    await worker.queue_frame(EndFrame())
                    await runner_done.wait()
                tg.cancel_scope.cancel()

    def idle(self) -> bool:
        """Nothing heard, thought or said is pending."""
        return not (self.listen.speaking or self.transcribe.busy or self._waiting or self.agent.busy
                    or self.surface.playing() or self.speak.busy)

    # -- events from the pipeline -----------------------------------------

    def assistant_busy(self) -> bool:
        return self.agent.busy or self.surface.playing()

    def woke(self) -> None:
        self.transcript("(okay: listening)")

    async def user_started(self, onset: int) -> bool:
        """Speech onset while the assistant is busy: pause the output at once
        (the acknowledgement); the judge then confirms or resumes. Returns
        whether this utterance is a barge-in (it needs no wake word)."""
        if self.judge.pending or not self.assistant_busy():
            return False
        self.judge.start(onset)
        self.device.buffer.request_pause()
        self._pause_turn = self.agent.current_turn
        self._log_speech(ev.SPEECH_PAUSED, {"onset": onset})
        return True

    async def barge_in_block(self, samples: int, voiced: bool, position: int) -> bool:
        """Returns True when the pending barge-in was confirmed (the pipeline
        then pushes an InterruptionFrame)."""
        onset = self.judge.onset
        verdict = self.judge.feed(samples, voiced, position)
        return await self._settle(verdict, onset, "voiced speech" if verdict == "confirm" else "no speech followed")

    async def _settle(self, verdict: str | None, onset: int | None, reason: str) -> bool:
        if verdict is None or onset is None:
            return False
        if verdict == "resume":
            self.device.buffer.request_resume()
            self._log_speech(ev.SPEECH_RESUMED, {"onset": onset, "reason": reason})
            return False
        if self.agent.busy and self.turns:
            self.turns[-1].barge_in_onset = onset  # turns run one at a time: the last is the running one
        self.agent.cancel()
        self.device.buffer.request_clear()
        self.device.buffer.request_resume()  # the clear comes first in the same pull: nothing old plays
        return True

    def _log_speech(self, type_: str, payload: dict[str, Any]) -> None:
        turn = self._pause_turn
        self.store.append(self.conversation, type_, payload, turn=turn)

    async def user_text(self, frame: UserTextFrame) -> None:
        if self.judge.pending and frame.start == self.judge.onset:
            # The utterance that paused the output ended before the judge
            # decided: its words decide. A backchannel is not a request.
            onset = self.judge.onset
            verdict = self.judge.heard(frame.text, self.surface.speaking_text())
            if await self._settle(verdict, onset, f"heard {frame.text!r}"):
                await self.listen.push_frame(InterruptionFrame())
            if verdict == "resume":
                return
        self.transcript(f"you: {frame.text}")
        self._waiting += 1
        await self._send.send(_Request(frame.text, "voice", frame.start, frame.end, frame.stt_s))

    # -- control (the socket's requests) -----------------------------------

    async def submit_text(self, text: str, source: str = "text") -> Any:
        """A typed turn, answered by voice; returns its TurnResult."""
        position = self.listen.position
        request = _Request(text, source, position, position, 0.0, done=anyio.Event())
        self._waiting += 1
        await self._send.send(request)
        await request.done.wait()
        return request.result

    async def interrupt(self) -> bool:
        """The barge-in protocol, without the speech: cancel the turn, drop
        queued speech, clear the speaker buffer."""
        cancelled = self.agent.cancel()
        self.device.buffer.request_clear()
        await self.listen.push_frame(InterruptionFrame())
        return cancelled

    def state(self) -> str:
        if self.listen.muted:
            return "muted"
        if self.listen.speaking:
            return "hearing"
        gate = self.listen.gate
        if gate is not None and gate.mode == "wake" and not (self.transcribe.busy or self.agent.busy):
            return gate.state(self.listen.position / MIC_RATE)
        if self.transcribe.busy:
            return "transcribing"
        if self.agent.busy:
            return "speaking" if self.surface.playing() else "thinking"
        return "listening"

    def late(self, kind: str, ref: UnitRef, info: dict[str, Any]) -> None:
        if ref.conversation != self.conversation:
            return  # the assistant's own notices are not part of any turn
        self.store.append(self.conversation, ev.LATE_OUTPUT, {"kind": kind, "message_id": ref.message_id, **info},
                          turn=ref.turn, step=ref.step, attempt=ref.attempt)

    # -- turns -------------------------------------------------------------

    async def _run_turns(self) -> None:
        async with self._receive:
            async for request in self._receive:
                try:
                    info = TurnInfo(-1, request.text, request.start, request.end, request.stt_s, anyio.current_time())
                    self.turns.append(info)
                    result = request.result = await self._turn(request.text, request.source, info)
                    reply = turn_reply(self.store, self.conversation, result.turn)
                    if reply.delivered_text or reply.interrupted:
                        stopped = "[stopped]" if reply.interrupted else ""
                        self.transcript(" ".join(p for p in ("assistant:", reply.delivered_text, stopped) if p))
                finally:
                    self._waiting -= 1
                    if request.done is not None:
                        request.done.set()

    async def _turn(self, text: str, source: str, info: TurnInfo):
        result = await self.agent.run_turn(text, source=source)
        info.turn = result.turn
        if info.barge_in_onset is not None:  # the acknowledgement: output paused (or cleared) after the onset
            marks = sorted(self.device.buffer.pauses + self.device.buffer.clears)
            info.clear_position = next((c for c in marks if c >= info.barge_in_onset), None)
        return result

    def speech_span(self, turn: int) -> tuple[int, int] | None:
        """Device positions of the first and last played sample of a turn's speech."""
        spans = [self.device.buffer.span(key) for key in self.device.buffer.keys() if key[0].turn == turn
                 and key[0].conversation == self.conversation]
        spans = [s for s in spans if s is not None and s[1] > s[0]]
        if not spans:
            return None
        return min(s[0] for s in spans), max(s[1] for s in spans)
