"""End of turn on real and synthetic speech: false splits and delay.

    python benchmarks/turn_end.py [--stt tiny.en|base] [--smart-turn] [--json OUT]

Each clip (tests/fixtures/audio/human/ and the espeak fixtures), followed by
1.5 s of silence, is fed in 20 ms blocks to pipecat's Silero analyzer with
the configured VAD settings, exactly as ListenProcessor does (0.5 s
pre-roll), with the real `TurnEndTracker` deciding. A speculative
recognition really runs (Whisper, in process) and its result becomes
visible to the tracker after as many blocks as its compute took, as the
executor would deliver it on 2 cores. Per clip: the utterances it was cut
into (more than one is a false split: every clip is one utterance), the
end-of-turn delay (speech end -> decision), recognition left after the
end of turn (0 when the speculative transcript was used), and the word
error of the transcript used against the clip's transcript, next to
today's rule (stop_secs silence, then a full recognition). Either way the
audio recognised is `TurnEndTracker.speech`: the voiced blocks and 50 ms after.

With `--smart-turn`, pipecat's smart-turn v3 (its ONNX model ships in the
wheel) also scores every speculation point, for comparison only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from common import AUDIO, RATE, read_wav, stats, word_edit_distance, words  # noqa: E402

BLOCK = 320
PREROLL = int(0.5 * RATE)
ESPEAK = {"what_time.wav": "What time is it?", "tell_london.wav": "Tell me about London.",
          "three_points.wav": "Give me three points about the sea.",
          "stop.wav": "Stop. Tell me something else instead.", "wait.wav": "Wait, what was that?",
          "set_timer.wav": "Set a timer for ten seconds.", "add_note.wav": "Add a note: buy milk."}


class _Job:
    """A recognition whose result shows after its compute time in blocks."""

    def __init__(self, transcript, ready_at: int, clock):
        self._t, self._ready_at, self._clock = transcript, ready_at, clock

    def done(self):
        return self._clock() >= self._ready_at

    def cancelled(self):
        return False

    def exception(self):
        return None

    def result(self):
        return self._t

    def add_done_callback(self, fn):
        pass


def clips() -> list[dict]:
    index = json.loads((AUDIO / "human" / "index.json").read_text())
    out = [dict(name=f["file"], path=AUDIO / "human" / f["file"], text=f["transcript"], human=True,
                kind=f["kind"], split=f["split"], speech_end=f["speech_s"][1]) for f in index["files"]]
    for name, text in ESPEAK.items():
        x = read_wav(AUDIO / name)
        loud = np.nonzero(np.abs(x) > 500)[0]
        out.append(dict(name=name, path=AUDIO / name, text=text, human=False, kind="utterance", split="espeak",
                        speech_end=(loud[-1] + 1) / RATE))
    return out


def run_clip(clip: dict, stt, settings, vad, stop_phrases, smart=None, latency_s=None) -> dict:
    from pipecat.audio.vad.vad_analyzer import VADState

    from voice.speech.turn_end import TurnEndTracker

    x = np.concatenate([read_wav(clip["path"]), np.zeros(int(1.5 * RATE), np.int16)])
    block_no = 0
    scores = []

    def start_job(audio):
        t = stt.transcribe(audio)
        if smart is not None:
            scores.append(round(float(smart._predict_endpoint(audio)["probability"]), 3))
        seconds = t.seconds if latency_s is None else latency_s
        return _Job(t, block_no + max(1, int(np.ceil(seconds * RATE / BLOCK))), lambda: block_no)

    tracker = TurnEndTracker(settings, start_job, RATE, stop_phrases)
    vad._vad_state = VADState.QUIET  # a fresh analyzer state per clip (the model itself keeps no long memory)
    preroll, utterance, speaking = bytearray(), bytearray(), False
    ends = []
    for block_no in range(len(x) // BLOCK):
        audio = x[block_no * BLOCK:(block_no + 1) * BLOCK].tobytes()
        state = vad._run_analyzer(audio)
        preroll = (preroll + audio)[-PREROLL * 2:]
        if speaking:
            utterance += audio
        if not speaking and state == VADState.SPEAKING:
            speaking, utterance = True, bytearray(preroll)
            tracker.reset()
        if not speaking:
            continue
        voiced = state in (VADState.STARTING, VADState.SPEAKING)
        early = tracker.block(utterance, BLOCK, voiced, may_speculate=True)
        if early or state == VADState.QUIET:
            at = (block_no + 1) * BLOCK / RATE
            spec = tracker.transcript()
            if spec is not None:
                text, stt_after = spec.text, 0.0
                # a job still running that covers the utterance would be awaited
            else:
                pending = tracker.pending()
                if pending is not None:
                    text, stt_after = pending.result().text, max(0.0, (pending._ready_at - block_no) * BLOCK / RATE)
                else:
                    t = stt.transcribe(np.frombuffer(tracker.speech(utterance), np.int16).astype(np.float32) / 32768.0)
                    text, stt_after = t.text, t.seconds if latency_s is None else latency_s
            ends.append(dict(at=round(at, 3), early=early, text=text, stt_after_s=round(stt_after, 3),
                             speculations=tracker.started))
            speaking = False
            tracker.abandon()
    last = ends[-1] if ends else None
    joined = " ".join(e["text"] for e in ends)
    ref = words(clip["text"])
    return dict(name=clip["name"], human=clip["human"], split=clip["split"], kind=clip["kind"], utterances=len(ends),
                false_splits=max(0, len(ends) - 1), ends=ends,
                delay_ms=round((last["at"] - clip["speech_end"]) * 1000) if last else None,
                stt_after_ms=round(last["stt_after_s"] * 1000) if last else None,
                word_errors=word_edit_distance(words(joined), ref), ref_words=len(ref), smart_turn=scores)


def evaluate(stt_model: str, *, early: bool, smart_turn: bool = False, latency_s: float | None = None,
             settings_override=None) -> dict:
    from voice.config import load_config
    from voice.speech.builder import vad_analyzer
    from voice.settings import Settings
    from voice.speech.settings import VoiceSettings
    from voice.speech.stt import WhisperEngine
    from voice.settings import TurnEndSettings

    settings = VoiceSettings.from_settings(Settings.from_config(load_config(None)))
    vad = vad_analyzer(settings.vad)
    vad.set_sample_rate(RATE)
    stt = WhisperEngine(stt_model)
    smart = None
    if smart_turn:
        from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3
        smart = LocalSmartTurnAnalyzerV3(cpu_count=1)
    te = (settings_override or settings.turn_end) if early else TurnEndSettings(enabled=False)
    rows = [run_clip(c, stt, te, vad, settings.barge_in.stop_phrases, smart, latency_s) for c in clips()]
    whole = [r for r in rows if r["kind"] == "utterance"]
    return dict(stt=stt_model, early=early, rows=rows,
                false_splits=sum(r["false_splits"] for r in whole),
                delay_ms=stats([r["delay_ms"] for r in whole]),
                stt_after_ms=stats([r["stt_after_ms"] for r in whole]),
                wer=sum(r["word_errors"] for r in whole if r["human"]) / sum(r["ref_words"] for r in whole if r["human"]),
                early_ends=sum(1 for r in whole for e in r["ends"] if e["early"]), n=len(whole))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stt", default="tiny.en")
    p.add_argument("--smart-turn", action="store_true")
    p.add_argument("--latency-ms", type=float, help="model each recognition as taking this long (default: as measured;"
                   " 0 shows the most the rule can end early, the worst case for false splits)")
    p.add_argument("--speculate-s", type=float)
    p.add_argument("--end-s", type=float)
    p.add_argument("--json")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    out = {}
    from voice.settings import TurnEndSettings

    override = TurnEndSettings(**{k: v for k, v in (("speculate_s", args.speculate_s), ("end_s", args.end_s))
                                  if v is not None})
    latency = None if args.latency_ms is None else args.latency_ms / 1000
    for early in (False, True):
        r = evaluate(args.stt, early=early, smart_turn=args.smart_turn and early, latency_s=latency,
                     settings_override=override)
        out["early" if early else "vad_only"] = r
        print(f"{args.stt} {'early' if early else 'vad only'}: false splits {r['false_splits']}, "
              f"early ends {r['early_ends']}/{r['n']}, delay p50 {r['delay_ms']['p50']:.0f} p95 {r['delay_ms']['p95']:.0f} ms, "
              f"recognition after end p50 {r['stt_after_ms']['p50']:.0f} p95 {r['stt_after_ms']['p95']:.0f} ms, "
              f"human WER {r['wer']:.3f}")
        for row in r["rows"]:
            if row["false_splits"] or args.smart_turn:
                print("   ", row["name"], row["utterances"], [e["text"] for e in row["ends"]], row["delay_ms"],
                      row["smart_turn"])
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
