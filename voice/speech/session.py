"""A voice session: one audio device, the pipecat pipeline, and the runtime.

It owns a task group with three children: the pipecat worker, the device
(which feeds mic blocks in and pulls speaker blocks out), and the turn
runner (which takes recognised utterances one at a time to the agent loop).
A barge-in (speech onset while the assistant has a turn running or audio
playing) cancels the turn, pushes an `InterruptionFrame` and clears the
speaker buffer in the device callback.

The words of an utterance that cut the assistant decide what follows: a
stop intent ("stop", "never mind") or a backchannel ("mm hmm") is the
person's stop and nothing more: it is recorded as `user/stop` and opens no
turn. Anything else is a request and is answered.

The transcript (`transcript`, one line each) is written in the order things
happened, by the turn runner: `you: …` as a request's turn starts (after
the `assistant: … [stopped]` line of the reply it cut), `assistant: …` as
a turn ends however it ends, `notice: …` for timers and the assistant's own
messages. `aside` (with `-v`) gets what was heard and not acted on.
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
from voice.speech.barge_in import STOP_PHRASES, BargeInJudge, is_backchannel, stop_intent
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
    stop_phrases: tuple[str, ...] | list[str] = STOP_PHRASES


@dataclass(frozen=True)
class ListenSettings:
    mode: str = "wake"  # "wake": a wake word (or the conversation window) first; "open": everything
    wake_word: str = "okay_nabu"
    window_s: float = 8.0


@dataclass
class _Request:
    """An utterance (or typed text) waiting for its turn, or (`stop` set) a
    stop the person said, waiting only to be written down in order."""

    text: str
    source: str
    start: int
    end: int
    stt_s: float
    done: anyio.Event | None = None
    result: Any = None
    # Why it is no request: "stop" (a stop intent); "backchannel" or "sound" (no
    # words, or too unsure to be words) when it had cut the reply by its length.
    stop: str | None = None
    stopped_turn: int | None = None


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
    aside: Callable[[str], None] | None = None  # -v: what was heard and not acted on
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
                                    output_latency=self.device.output_latency, on_late=self.late,
                                    on_notice=lambda text: self.transcript(f"notice: {text}"))
        self.speak = SpeakProcessor(self.tts, self.surface, self)
        self.play = PlayProcessor(self.surface)
        self.agent = AgentLoop(self.store, self.provider, self.surface, self.conversation, self.tools, self.settings,
                               self.tool_env)
        self._send, self._receive = anyio.create_memory_object_stream[_Request](16)
        self.judge = BargeInJudge(self.barge_in.confirm_ms, self.barge_in.resume_ms)
        self._pause_turn: int | None = None
        self._cut: tuple[int, int | None] | None = None  # (onset, turn) of a barge-in confirmed before its words
        self._words_due: set[int] = set()  # onsets of utterances that ended and are being transcribed
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

    def utterance_ended(self, onset: int) -> None:
        self._words_due.add(onset)

    def ignored(self, why: str) -> None:
        """Something heard and not acted on (no wake word, a backchannel, the
        assistant's own echo): an aside, shown with -v."""
        if self.aside is not None:
            self.aside(f"(ignored: {why})")

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
        words_due = self.listen.speaking or onset in self._words_due
        verdict = self.judge.feed(samples, voiced, position, words_due)
        if verdict == "confirm" and onset is not None:
            self._cut = (onset, self._pause_turn)  # its words, once heard, say whether it asked for more
        elif verdict == "resume":
            self.ignored("a sound paused the reply and no speech followed; the reply went on")
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
        """A finished utterance's words (possibly none: a sound). Over the
        assistant, they decide whether it was a barge-in at all; then whether
        it asks for anything: a stop or a backchannel does not."""
        self._words_due.discard(frame.start)
        pending = self.judge.pending and frame.start == self.judge.onset
        cut_by_length = self._cut is not None and self._cut[0] == frame.start
        text = frame.text
        if (pending or cut_by_length) and frame.doubtful:  # a hum Whisper made words of: a sound
            self.ignored(f"heard {text!r} over the reply, too unsure to be words")
            text = ""
        if pending:
            # It ended before the judge decided: its words decide.
            cut_turn = self._pause_turn
            if not await self._judge_words(text):
                return
        elif cut_by_length:
            cut_turn, self._cut = self._cut[1], None
        else:
            cut_turn = None
        cut = pending or cut_by_length
        if not text and not cut:
            self.ignored("a sound with no words")
            return
        if not text:  # it stopped the reply by its length, and asked for nothing: recorded as such
            stop: str | None = "sound"
            text = frame.text
        elif stop_intent(text, self.barge_in.stop_phrases):
            stop = "stop"
        else:
            stop = None
        if stop is None and cut and is_backchannel(text):
            stop = "backchannel"  # it cut the reply by its length; its words ask for nothing
        if stop is not None and not cut and self.assistant_busy():
            # a stop said just as the assistant started: it stops it all the same
            cut_turn = self.agent.current_turn
            if self.agent.busy and self.turns:
                self.turns[-1].barge_in_onset = frame.start
            await self.interrupt()
        self._waiting += 1
        await self._send.send(_Request(text, "voice", frame.start, frame.end, frame.stt_s, stop=stop,
                                       stopped_turn=cut_turn))

    async def _judge_words(self, text: str) -> bool:
        """The pending barge-in decided by its words: False when they were a
        backchannel or the assistant's own echo (the reply goes on)."""
        onset = self.judge.onset
        verdict = self.judge.heard(text, self.surface.speaking_text())
        if await self._settle(verdict, onset, f"heard {text!r}"):
            await self.listen.push_frame(InterruptionFrame())
        if verdict == "resume":
            what = "a sound with no words" if not text else f"{text!r}, " + (
                "a backchannel," if is_backchannel(text) else "the assistant's own voice (echo),")
            self.ignored(f"{what} over the reply; the reply went on")
            return False
        return True

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

    @property
    def wake_word(self) -> str | None:
        """The wake word's model name when utterances need one ("okay_nabu")."""
        mode = self.listen_mode
        return mode.wake_word if mode is not None and mode.mode == "wake" else None

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
                    if request.stop != "sound":
                        self.transcript(f"you: {request.text}")
                    if request.stop is not None:
                        self._record_stop(request)
                        if self.aside is not None:
                            what = {"stop": "a stop", "backchannel": "a backchannel"}.get(request.stop, "a sound")
                            self.aside(f"({what}: not a request, so nothing more is said)")
                        continue
                    info = TurnInfo(-1, request.text, request.start, request.end, request.stt_s, anyio.current_time())
                    self.turns.append(info)
                    before = self.store.last_seq()
                    try:
                        result = request.result = await self._turn(request.text, request.source, info)
                    except anyio.get_cancelled_exc_class():  # shutdown: the turn closed `interrupted`
                        started = self.store.events(self.conversation, types={ev.TURN_START}, after_seq=before)
                        if started:
                            self._print_reply(started[0].turn)
                        raise
                    self._print_reply(result.turn)
                finally:
                    self._waiting -= 1
                    if request.done is not None:
                        request.done.set()

    def _print_reply(self, turn: int) -> None:
        """`assistant: …` with `[stopped]` when the reply ended early, however it ended."""
        reply = turn_reply(self.store, self.conversation, turn)
        stopped = reply.interrupted or reply.outcome in (ev.ABORTED, ev.INTERRUPTED)
        if reply.delivered_text or stopped:
            self.transcript(" ".join(p for p in ("assistant:", reply.delivered_text, "[stopped]" if stopped else "")
                                     if p))

    def _record_stop(self, request: _Request) -> None:
        """The person's stop: a record of what they said, in no turn of its
        own (it is not a request), filed under the turn it stopped."""
        self.store.append(self.conversation, ev.USER_STOP,
                          {"content": request.text, "source": request.source, "intent": request.stop,
                           "stopped_turn": request.stopped_turn}, turn=request.stopped_turn)

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
