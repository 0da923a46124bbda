"""What bounds ack_ms: pipecat's Silero analyzer reaching SPEAKING.

In process, the mic stream is fed to `SileroVADAnalyzer` exactly as
voice/speech/pipeline.py's ListenProcessor feeds it (20 ms blocks of 16 kHz
int16; the analyzer works on 512-sample frames, with a 0.4 s loudness window
exponentially smoothed with factor 0.2). For each (start_secs, min_volume,
confidence) the detection delay is measured from the clip's speech onset
(first sample above 500, the replay's onset rule) to the end of the 20 ms
block on which the state becomes SPEAKING, over 8 alignments of the clip
against the block/frame grid. That delay is the floor of the replay's
ack_ms (which adds the pipeline hop and the device block on which the
buffer is cleared).

False triggers: the same analyzer on non-speech (3 s white noise, 3 s
brown "fan" noise, a cough-like burst pair, a door-knock-like click train)
and a harmonic hum (music-like), each at three levels.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from common import AUDIO, RATE, first_loud, read_wav, stats

BLOCK = 320
GRID = list(itertools.product((0.05, 0.1), (0.6, 0.4, 0.2), (0.7, 0.5)))  # start_secs, min_volume, confidence


def _analyzer(start_secs: float, min_volume: float, confidence: float):
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.audio.vad.vad_analyzer import VADParams

    a = SileroVADAnalyzer(sample_rate=RATE, params=VADParams(confidence=confidence, start_secs=start_secs,
                                                             stop_secs=0.6, min_volume=min_volume))
    a.set_sample_rate(RATE)
    return a


def detect_direct(analyzer, signal: np.ndarray) -> list[int]:
    """Feed `signal` in 20 ms blocks; the sample positions (block ends) where
    the state turned SPEAKING."""
    from pipecat.audio.vad.vad_analyzer import VADState

    hits, speaking = [], False
    for pos in range(0, len(signal) - BLOCK + 1, BLOCK):
        state = analyzer._run_analyzer(signal[pos:pos + BLOCK].tobytes())
        if state == VADState.SPEAKING and not speaking:
            hits.append(pos + BLOCK)
        speaking = state in (VADState.SPEAKING, VADState.STOPPING)
    return hits


def _offsets(n: int) -> list[int]:
    return [(i * 2560 // n + i * 41) % 2560 for i in range(n)]


def noise_clips(seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    clips = {}
    for level_name, rms in (("-26dBFS", 0.05), ("-14dBFS", 0.2), ("-9dBFS", 0.35)):
        white = rng.standard_normal(3 * RATE)
        clips[f"white_noise_3s_{level_name}"] = white / np.sqrt(np.mean(white ** 2)) * rms
        brown = np.cumsum(rng.standard_normal(3 * RATE))
        brown -= np.convolve(brown, np.ones(801) / 801, mode="same")  # drift removal (high-pass)
        clips[f"fan_noise_3s_{level_name}"] = brown / np.sqrt(np.mean(brown ** 2)) * rms
        # a cough-like burst: band-passed noise, fast attack, ~120 ms decay, twice
        t = np.arange(int(0.35 * RATE)) / RATE
        burst = rng.standard_normal(len(t))
        burst = np.convolve(burst, np.hanning(9), mode="same") - np.convolve(burst, np.hanning(81) / 40, mode="same")
        env = (1 - np.exp(-t / 0.008)) * np.exp(-t / 0.12)
        b = burst / np.max(np.abs(burst)) * env
        cough = np.concatenate([b, np.zeros(int(0.25 * RATE)), b * 0.8, np.zeros(int(0.5 * RATE))])
        clips[f"cough_burst_{level_name}"] = cough / np.sqrt(np.mean(cough[:len(b)] ** 2)) * rms * 2
        # a knock / clap train: 5 clicks 150 ms apart
        click = np.zeros(int(0.15 * RATE))
        click[:200] = rng.standard_normal(200) * np.exp(-np.arange(200) / 30)
        knock = np.tile(click, 5)
        clips[f"knock_train_{level_name}"] = knock / np.max(np.abs(knock)) * min(0.95, rms * 4)
        # a hum / music-like tone: 150 Hz with harmonics and 5 Hz vibrato, 3 s
        t3 = np.arange(3 * RATE) / RATE
        phase = 2 * np.pi * np.cumsum(150 * (1 + 0.02 * np.sin(2 * np.pi * 5 * t3))) / RATE
        hum = sum(np.sin(h * phase) / h for h in range(1, 8))
        clips[f"harmonic_hum_3s_{level_name}"] = hum / np.sqrt(np.mean(hum ** 2)) * rms
    return {k: np.clip(v * 32767, -32768, 32767).astype(np.int16) for k, v in clips.items()}


def frame_features(signal: np.ndarray) -> list[tuple[float, float]]:
    """(confidence, smoothed volume) per 512-sample frame, exactly as
    VADAnalyzer._run_analyzer computes them. Neither depends on VADParams,
    so the whole grid is evaluated from one pass of the model."""
    from pipecat.audio.utils import exp_smoothing

    a = _analyzer(0.1, 0.6, 0.7)
    n = a._vad_frames
    feats, prev = [], 0.0
    for k in range(len(signal) // n):
        frame = signal[k * n:(k + 1) * n].tobytes()
        conf = a.voice_confidence(frame)
        a._volume_tracker.update(frame, RATE)
        prev = exp_smoothing(a._volume_tracker.volume, prev, a._smoothing_factor)
        feats.append((conf, prev))
    return feats


def speaking_at(feats, start_secs: float, min_volume: float, confidence: float, frame: int = 512) -> list[int]:
    """The block-end sample positions where the state turns SPEAKING (the
    analyzer's state machine; the check runs once per 20 ms block fed)."""
    start_frames = round(start_secs / (frame / RATE))
    stop_frames = round(0.6 / (frame / RATE))
    state, count, stop, hits = "quiet", 0, 0, []
    for k, (conf, vol) in enumerate(feats):
        speaking = conf >= confidence and vol >= min_volume
        if speaking:
            if state == "quiet":
                state, count = "starting", 1
            elif state == "starting":
                count += 1
            elif state == "stopping":
                state, stop = "speaking", 0
        else:
            if state == "starting":
                state, count = "quiet", 0
            elif state == "speaking":
                state, stop = "stopping", 1
            elif state == "stopping":
                stop += 1
        # the analyzer only checks the thresholds after the whole block is consumed:
        # the block that completed this frame; a later frame in the same block may undo "starting"
        block_end = -(-((k + 1) * frame) // BLOCK) * BLOCK
        next_in_same_block = (k + 2) * frame <= block_end
        if next_in_same_block:
            continue
        if state == "starting" and count >= start_frames:
            state, count = "speaking", 0
            hits.append(block_end)
        if state == "stopping" and stop >= stop_frames:
            state, stop = "quiet", 0
    return hits


def run_grid(alignments: int = 8, grid=GRID, speech=("stop.wav", "wait.wav")) -> list[dict[str, Any]]:
    lead = np.zeros(int(1.5 * RATE), np.int16)
    tail = np.zeros(int(1.0 * RATE), np.int16)
    clips = {name: read_wav(AUDIO / name) for name in speech}
    speech_feats = []  # (name, onset position, features)
    for name, clip in clips.items():
        for off in _offsets(alignments):
            sig = np.concatenate([lead, np.zeros(off, np.int16), clip, tail])
            speech_feats.append((name, len(lead) + off + first_loud(clip), frame_features(sig)))
    noise_feats = []
    for name, noise in noise_clips().items():
        for off in _offsets(2):
            noise_feats.append((name, frame_features(np.concatenate([lead, np.zeros(off, np.int16), noise, tail]))))
    rows = []
    for start_secs, min_volume, confidence in grid:
        delays: dict[str, list[float]] = {name: [] for name in clips}
        missed = 0
        for name, on, feats in speech_feats:
            hits = [h for h in speaking_at(feats, start_secs, min_volume, confidence) if h > on - BLOCK]
            if hits:
                delays[name].append((hits[0] - on) / RATE * 1000)
            else:
                missed += 1
        false: dict[str, int] = {}
        for name, feats in noise_feats:
            if speaking_at(feats, start_secs, min_volume, confidence):
                false[name] = false.get(name, 0) + 1
        allv = [d for v in delays.values() for d in v]
        rows.append({
            "start_secs": start_secs, "min_volume": min_volume, "confidence": confidence,
            "vad_delay_ms": stats(allv),
            **{f"vad_delay_ms_{n.removesuffix('.wav')}": stats(v)["p50"] for n, v in delays.items()},
            "missed": missed, "trials": len(speech_feats),
            "false_triggers": sum(false.values()), "false_trials": len(noise_feats),
            "false_detail": false,
        })
    return rows


def cpu_cost(seconds: float = 10.0) -> dict[str, float]:
    """CPU time of Silero + the loudness volume per second of audio (what the
    listening pipeline pays even in silence), on one core."""
    import time

    rng = np.random.default_rng(1)
    sig = (rng.standard_normal(int(seconds * RATE)) * 30).astype(np.int16)  # near-silence
    t0 = time.process_time()
    frame_features(sig)
    cpu = time.process_time() - t0
    return {"cpu_pct_of_realtime": cpu / seconds * 100, "ms_per_512_frame": cpu / (len(sig) / 512) * 1000}


def format_rows(rows: list[dict[str, Any]], replay_ack: dict | None = None) -> str:
    lines = ["| start_secs | min_volume | confidence | VAD delay p50 / p95 ms (stop, wait) | missed | false triggers | replay ack p50 / p95 ms |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        key = (r["start_secs"], r["min_volume"], r["confidence"])
        ra = (replay_ack or {}).get(key)
        ra_s = f"{ra['p50']:.0f} / {ra['p95']:.0f} (n={ra['n']})" if ra and ra.get("n") else "-"
        d = r["vad_delay_ms"]
        fd = ", ".join(f"{k}:{v}" for k, v in r["false_detail"].items())
        lines.append(f"| {r['start_secs']} | {r['min_volume']} | {r['confidence']} | "
                     f"{d['p50']:.0f} / {d['p95']:.0f} ({r['vad_delay_ms_stop']:.0f}, {r['vad_delay_ms_wait']:.0f}) | "
                     f"{r['missed']}/{r['trials']} | {r['false_triggers']}/{r['false_trials']}"
                     f"{' (' + fd + ')' if fd else ''} | {ra_s} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import time

    t = time.perf_counter()
    rows = run_grid()
    print(format_rows(rows))
    print(f"{time.perf_counter() - t:.1f} s")
