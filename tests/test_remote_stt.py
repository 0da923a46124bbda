"""`stt.base_url`: recognition on an OpenAI-compatible transcription server
(voice.speech.stt.RemoteSttEngine), against a loopback server with real
faster-whisper behind it (tests/loopback_stt.py): the same words as local
recognition, doubtful sounds judged the same way, a whole `voice replay`
answered through it, and a bad URL refused in one line before anything
loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loopback_stt import LoopbackStt
from voice.audio.wav import read_mono16k
from voice.speech.builder import loaded_once
from voice.speech.stt import RemoteSttEngine, WhisperEngine

ROOT = Path(__file__).resolve().parents[1]
AUDIO = ROOT / "tests" / "fixtures" / "audio"


@pytest.fixture(scope="module")
def server():
    with LoopbackStt() as s:
        yield s


def _float(name: str) -> np.ndarray:
    return read_mono16k(AUDIO / name).astype(np.float32) / 32768


@pytest.mark.slow  # Whisper, here and in the server
@pytest.mark.parametrize("clip", ["what_time.wav", "set_timer.wav", "cough.wav"])
def test_the_server_hears_what_local_recognition_hears(server, clip):
    remote = RemoteSttEngine(server.base_url, "tiny.en").transcribe(_float(clip))
    local = loaded_once(WhisperEngine, "tiny.en").transcribe(_float(clip))
    assert (remote.text, remote.doubtful) == (local.text, local.doubtful)
    assert server.requests[-1]["model"] == "tiny.en" and server.requests[-1]["language"] == "en"
    assert server.requests[-1]["response_format"] == "verbose_json"  # for the doubt check's log-probabilities


def test_a_bad_base_url_is_refused_in_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VOICE_STT_BASE_URL": "gpu-box:8000",
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    r = subprocess.run([sys.executable, "-m", "voice", "config", "show"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith('voice: error: env VOICE_STT_BASE_URL: stt.base_url = "gpu-box:8000" must be '), line


@pytest.mark.slow
def test_a_replay_is_answered_through_the_server(server, tmp_path):
    """The whole voice path with `stt.base_url`: the utterance (and its
    speculative recognition at the pause) goes to the server."""
    scenario = tmp_path / "ask.toml"
    scenario.write_text(f'[[user]]\naudio = "{AUDIO / "what_time.wav"}"\nat = 0.5\n\n[[reply]]\ntext = "It is noon."\n')
    config = tmp_path / "voice.toml"
    config.write_text(f'[stt]\nbase_url = "{server.base_url}"\nremote_model = "tiny.en"\n')
    before = len(server.requests)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path / "config"), "NO_PROXY": "*"}
    r = subprocess.run([sys.executable, "-m", "voice", "replay", str(scenario), "--out", str(tmp_path / "out"),
                        "--config", str(config)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [t["user_text"] for t in summary["turns"]] == ["What time is it?"]
    assert len(server.requests) > before


@pytest.mark.slow
def test_a_server_that_is_down_is_said_and_nothing_is_answered(tmp_path):
    """The recognition server does not answer: the person is told, in the
    transcript, that they were not heard; no turn starts; no traceback."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    scenario = tmp_path / "ask.toml"
    scenario.write_text(f'[[user]]\naudio = "{AUDIO / "what_time.wav"}"\nat = 0.5\n\n[[reply]]\ntext = "It is noon."\n')
    config = tmp_path / "voice.toml"
    config.write_text(f'[stt]\nbase_url = "http://127.0.0.1:{port}/v1"\ntimeout_s = 2.0\n')
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_CONFIG_HOME": str(tmp_path / "config"), "NO_PROXY": "*"}
    r = subprocess.run([sys.executable, "-m", "voice", "replay", str(scenario), "--out", str(tmp_path / "out"),
                        "--config", str(config)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("notice: not heard:")]
    assert f"127.0.0.1:{port}" in line
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["turns"] == []
