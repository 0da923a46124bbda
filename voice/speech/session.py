"""A voice session: one audio device, the pipecat pipeline, the agent, and
the parts that run them. Built by `voice.speech.builder`, last, from the
parts (`SessionParts`); each role lives in its own module:

- barge-in control, pause / confirm or resume / clear (voice.speech.barge_in);
- the turn runner, one request at a time (voice.speech.turns);
- the pipeline's processors (voice.speech.pipeline) and the voice surface
  (voice.speech.voice_surface);
- the listener's decisions (voice.speech.listener), fed to the barge-in
  controller and the turn runner directly; the rows (voice.speech.speech_log);
- this module: `run()` (a task group with the pipecat worker, the device,
  the turn runner and the reader of the person's finished words, read from
  the converse stage in order: an answer, a stop or a request), the
  pipeline's interruption when the barge-in controller says its words or a
  `voice ctl cancel` stopped the reply, and the narrow control API the
  control socket uses (status, say, cancel, mute, history).

Shutdown (the device ended, or the caller cancelled): the turn queue is
closed first (nothing queued starts), the running turn is cancelled
`interrupted` (its heard prefix is recorded), then an EndFrame drains the
pipeline so pipecat closes its own tasks (one that does not drain in time
is cancelled through pipecat's runner); all of it shielded, within
`shutdown_s`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskStatus
from pipecat.frames.frames import EndFrame, InputAudioRawFrame, InterruptionFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.workers.runner import WorkerRunner

from voice.agent.loop import AgentLoop
from voice.agent.turn_state import TurnResult
from voice.audio.device import MIC_RATE, AudioDevice
from voice.audio.recording import Recorder
from voice.log import events as ev
from voice.log.conversations import NewConversation
from voice.log.projections import derive_messages
from voice.log.store import EventStore
from voice.agent.sleep_watch import SleepWatch
from voice.speech.after_sleep import AfterSleep
from voice.speech.audio_loss import AudioChanges
from voice.speech.barge_in import BargeInController
from voice.speech.pipeline import (
    ConverseProcessor,
    ListenProcessor,
    PlayProcessor,
    SpeakProcessor,
    TranscribeProcessor,
    UserTextFrame,
)
from voice.speech.settings import VoiceSettings
from voice.speech.speech_log import SpeechLog
from voice.speech.turns import Ask, AskAgain, Stop, TurnRunner
from voice.speech.voice_surface import VoiceSurface


@dataclass
class SessionParts:
    """The parts the builder made, each from those it needs, for the session."""

    listen: ListenProcessor
    transcribe: TranscribeProcessor
    converse: ConverseProcessor
    speak: SpeakProcessor
    play: PlayProcessor
    surface: VoiceSurface
    agent: AgentLoop
    barge_in: BargeInController
    turns: TurnRunner
    log: SpeechLog  # every row the speech side writes (voice.speech.speech_log)


class VoiceSession:
    def __init__(self, parts: SessionParts, *, store: EventStore, device: AudioDevice, settings: VoiceSettings,
                 stt_name: str, echo: Any = None, announcer: Any = None, transcript: Callable[[str], None],
                 aside: Callable[[str], None] | None = None, recorder: Recorder | None = None,
                 sleep: SleepWatch | None = None):
        self.parts = parts
        self.store = store
        self.device = device
        self.settings = settings
        self.stt_name = stt_name
        self.echo = echo  # an EchoCanceller, applied to the mic before the VAD (None: off)
        self.announcer = announcer  # the app's Announcer: this session's voice says what it announces
        self.transcript = transcript
        self.aside = aside  # -v: what was heard and not acted on
        self.recorder = recorder  # keeps the mic as captured and what played (voice.audio.recording)
        self.sleep = sleep  # the app's: while this session runs, a resume reopens its device

    # The parts other modules name directly.
    listen = property(lambda self: self.parts.listen)
    surface = property(lambda self: self.parts.surface)
    agent = property(lambda self: self.parts.agent)
    turns = property(lambda self: self.parts.turns.turns)

    @property
    def conversation(self) -> str:
        return self.parts.agent.conversation

    # -- lifecycle ---------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until the device ends (replay) or the caller cancels (live).
        Reports started (`task_status.started()`) once mic audio has reached
        the VAD: the service is listening."""
        p = self.parts
        asyncio.get_running_loop().set_default_executor(inference_pool())
        worker = PipelineWorker(
            Pipeline([p.listen, p.transcribe, p.converse, p.speak, p.play]),
            enable_rtvi=False, idle_timeout_secs=None, cancel_on_idle_timeout=False,
            params=PipelineParams(audio_in_sample_rate=MIC_RATE, audio_out_sample_rate=self.device.out_rate),
        )
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)

        mic_queued = 0  # samples handed to the pipeline: where the listener will be once it has them all

        async def on_mic(block: bytes, reference: bytes) -> None:
            nonlocal mic_queued
            if self.recorder is not None:  # before echo cancellation: the sound as it reached the mic
                self.recorder.add(block, reference)
            if self.echo is not None:
                block = self.echo.process(block, reference, busy=self.parts.barge_in.assistant_busy())
                if not block:
                    return
            mic_queued += len(block) // 2
            await worker.queue_frame(InputAudioRawFrame(audio=block, sample_rate=MIC_RATE, num_channels=1))

        runner_done = anyio.Event()
        # pipecat is ended through its own API (an EndFrame, else runner.cancel()),
        # never by our cancellation: its teardown awaits would each be cancelled
        # again (anyio cancels at every await, asyncio once) and leave its bus
        # tasks running. Shielded, and cancelled directly only as a last resort.
        pipeline_scope = anyio.CancelScope(shield=True)

        async def run_pipeline() -> None:
            try:
                with pipeline_scope:
                    await runner.run()
            finally:
                runner_done.set()

        words_read = anyio.Event()
        # Shielded like the pipeline, whose stage hands the words over: the words that came before
        # the pipeline's end are heard while it drains (a shutdown's only answer them "shutting down").
        words_scope = anyio.CancelScope(shield=True)

        async def hear() -> None:  # the person's finished words, in the order they were heard
            try:
                with words_scope, p.converse.words as words:
                    async for frame in words:
                        await self.user_text(frame)
            finally:
                words_read.set()

        async def report_listening() -> None:
            await p.listen.heard_audio.wait()
            p.log.clock()  # audio/clock: log times and the recording share one clock
            task_status.started()

        audio_changes = AudioChanges(log=p.log, surface=p.surface, agent=p.agent, transcript=self.transcript,
                                     restart_echo=self._restart_echo, mic_broke_off=lambda: p.listen.broke_off(mic_queued),
                                     idle_gap_s=p.turns.rules.idle_gap_s)
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_pipeline)
            tg.start_soon(p.turns.run)
            tg.start_soon(hear)
            tg.start_soon(report_listening)
            tg.start_soon(audio_changes.run)  # what a lost speaker could not say, said once it is back
            after_sleep = AfterSleep(log=p.log, device=self.device, conversations=p.turns.conversations,
                                     transcript=self.transcript)
            try:  # from here on the shutdown below always runs: the shielded pipeline needs it to end
                if self.sleep is not None:
                    self.sleep.on_resume(after_sleep)
                if self.announcer is not None:
                    await self.announcer.attach(p.surface.notice)
                await self.device.run(on_mic, audio_changes)
            finally:
                with anyio.CancelScope(shield=True):
                    # All of it within shutdown_s: a share is kept for cutting the pipeline short.
                    reserve = min(1.0, self.settings.shutdown_s / 4)
                    with anyio.move_on_after(self.settings.shutdown_s - reserve):
                        if self.sleep is not None:
                            self.sleep.forget(after_sleep)
                        if self.announcer is not None:
                            self.announcer.detach()
                        p.turns.close()
                        p.agent.cancel(ev.INTERRUPTED)
                        await p.agent.wait_idle()
                        await worker.queue_frame(EndFrame())
                        await runner_done.wait()
                        await words_read.wait()  # the words that came before the end are heard (if shutting down)
                    if not runner_done.is_set():  # the pipeline did not drain in time: cut it short
                        await runner.cancel("shutdown bound reached")
                        with anyio.move_on_after(reserve):
                            await runner_done.wait()
                        pipeline_scope.cancel()  # pipecat's own tasks may be left; its VAD thread is not
                        await p.listen.activity.release()
                    words_scope.cancel()  # (read to their end unless the pipeline never got there)
                tg.cancel_scope.cancel()

    def _restart_echo(self) -> None:
        """A reopened sound card is a new echo path: the canceller starts afresh."""
        if self.echo is not None:
            self.echo.restart()

    def idle(self) -> bool:
        """Nothing heard, thought or said is pending (a turn that waits for
        the person's answer to its question waits on them, not on itself)."""
        p = self.parts
        asking = p.agent.waiting_for_person  # the running turn (one of the requests waiting) asked its question
        thinking = p.agent.busy and not asking
        queued = p.turns.waiting - (1 if asking else 0)
        return not (p.listen.speaking or p.transcribe.busy or queued or thinking
                    or p.surface.playing() or p.speak.busy)

    # -- the person's words (from ConverseProcessor's stream) -----------------

    def ignored(self, why: str) -> None:
        """Something heard and not acted on: an aside, shown with -v."""
        if self.aside is not None:
            self.aside(f"(ignored: {why})")

    async def user_text(self, frame: UserTextFrame) -> None:
        """A finished utterance's words (possibly none: a sound). Over the
        assistant, they decide whether it was a barge-in at all; then whether
        it asks for anything: a stop or a backchannel does not."""
        p = self.parts
        heard = p.barge_in.heard(frame.text, frame.start, frame.doubtful, p.surface.speaking_text())
        if heard is None:
            return
        if heard.interrupts:
            await self._interrupt_pipeline()
        approvals = p.agent.tool_env.services.approvals
        if p.agent.waiting_for_person and approvals is not None and heard.stopped_turn is None:
            # The answer to the question the turn asked (voice.agent.approvals), not a request.
            if approvals.answer(heard.text, how="voice", conversation=self.conversation) is not None:
                self.transcript(f"you: {heard.text}")
                return
        try:
            if heard.stop is not None:
                request = Stop(heard.text, "voice", frame.start, frame.end, frame.stt_s, intent=heard.stop,
                               stopped_turn=heard.stopped_turn)
            else:
                request = Ask(heard.text, "voice", frame.start, frame.end, frame.stt_s)
            await p.turns.submit(request)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):  # words that arrive as the session ends
            self.ignored(f"{heard.text!r} was heard while shutting down")

    # -- the control API (voice.service.control.Assistant) -------------------

    @property
    def wake_word(self) -> str | None:
        """The wake word's model name when utterances need one ("okay_nabu")."""
        listen = self.settings.listen
        return listen.wake_word if listen is not None and listen.mode == "wake" else None

    def state(self) -> str:
        p = self.parts
        if self.device.audio_lost() is not None:  # deaf and mute until the device is back, whatever else runs
            return "waiting for audio" + (" (thinking)" if p.agent.busy else "")
        if p.listen.muted:
            return "muted"
        if p.listen.speaking:
            return "hearing"
        gate = p.listen.addressing.gate
        if gate is not None and gate.mode == "wake" and not (p.transcribe.busy or p.agent.busy):
            return gate.state(p.listen.position / MIC_RATE)
        if p.transcribe.busy:
            return "transcribing"
        if p.agent.busy:
            return "speaking" if p.surface.playing() else "thinking"
        return "listening"

    def status(self) -> dict[str, Any]:
        p = self.parts
        route = p.agent.provider.route
        gate = p.listen.addressing.gate
        approvals = p.agent.tool_env.services.approvals
        waiting = approvals.waiting(self.conversation) if approvals is not None else []
        mcp = p.agent.tool_env.services.mcp
        return {"state": self.state(), "turn": p.agent.current_turn, "conversation": self.conversation,
                "question": waiting[-1].question if waiting else None,
                "mcp": {s.spec.name: s.state for s in mcp.servers} if mcp is not None else {},
                "device": self.device.describe(), "audio_lost": self._audio_lost(), "mic_muted": self._mic_muted(),
                "stt": self.stt_name, "tts": "piper en_US-joe-medium",
                "llm": {"provider": route.provider, "model": route.model, "base_url": route.base_url},
                "muted": p.listen.muted,
                "listen": {"mode": gate.mode if gate else "open",
                           "state": gate.state(p.listen.position / MIC_RATE) if gate else "open",
                           "wake_word": self.wake_word}}

    def _audio_lost(self) -> dict[str, Any] | None:
        """While the sound card is lost: for how long, why, the reopening tries."""
        lost = self.device.audio_lost()
        if lost is None:
            return None
        return {"seconds": round(time.monotonic() - lost["since"], 1), "reason": lost["reason"],
                "attempts": lost["attempts"], "error": lost["error"], "at_start": lost["at_start"]}

    def _mic_muted(self) -> dict[str, Any] | None:
        """While the microphone gives exact zeros (a mute key): for how long."""
        since = self.device.mic_muted()
        return None if since is None else {"seconds": round(time.monotonic() - since, 1)}

    async def say(self, text: str, source: str = "text") -> TurnResult | NewConversation:
        """A typed turn, answered by voice; returns its result. Raises
        anyio.ClosedResourceError (or BrokenResourceError) when the session is
        shutting down."""
        return await self.parts.turns.say(text, source, self.parts.listen.position)

    async def cancel(self) -> bool:
        """The barge-in protocol without the speech."""
        self.parts.log.control("cancel")  # each control, where the mic is: a saved session replays it there
        cancelled = self.parts.barge_in.interrupt()
        await self._interrupt_pipeline()
        return cancelled

    async def _interrupt_pipeline(self) -> None:
        """pipecat's InterruptionFrame from the top of the pipeline (the
        listener), which drops queued sentences and cancels synthesis."""
        await self.parts.listen.push_frame(InterruptionFrame())

    def mute(self, muted: bool) -> bool:
        self.parts.log.control("mute" if muted else "unmute")
        self.parts.listen.muted = muted
        return muted

    def history(self, conversation: str | None = None) -> list[dict[str, Any]]:
        return derive_messages(self.store, conversation or self.conversation)

    async def new_conversation(self) -> str:
        """`voice ctl new`: the conversation ends (after a running turn); returns the next one's id."""
        self.parts.log.control("new")
        return await self.parts.turns.new_conversation(self.parts.listen.position)

    async def ask_again(self, asked: ev.ApprovalRequested) -> None:
        """A question a crash left unanswered, asked again in a turn of its
        own, in its place in the queue (voice.agent.approvals)."""
        position = self.parts.listen.position
        try:
            await self.parts.turns.submit(AskAgain("", "voice", position, position, 0.0, asked=asked))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.ignored("a question left unanswered was not asked again: shutting down")

    def answer_approval(self, granted: bool, always: bool) -> str | None:
        """`voice ctl approve|deny`: answers the question a call waits on."""
        approvals = self.parts.agent.tool_env.services.approvals
        pending = None if approvals is None else approvals.answer(
            how="ctl", decision="granted" if granted else "denied", always=always)
        return pending.question if pending is not None else None

    # -- for replay summaries ------------------------------------------------


def inference_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The executor Whisper and Piper run in (the loop's default), its
    threads all started now. asyncio's own adds a thread whenever more jobs
    overlap than ever before, up to cores + 4, so a service's thread count
    crept up over weeks (the 1,000-turn soak: 14 -> 15); more threads than
    cores would only make the models share them."""
    workers = min(4, max(2, os.cpu_count() or 2))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="voice-inference")
    started = threading.Barrier(workers, timeout=5.0)  # each job waits for all: one thread each
    concurrent.futures.wait([pool.submit(started.wait) for _ in range(workers)])  # (a broken barrier ends them)
    return pool

