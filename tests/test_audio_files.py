"""Reading scenario WAVs (voice/audio/wav.py) and loading replay scenarios
(voice/audio/scenario.py)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from voice.service.scenario import Scenario, ScenarioTool, load_scenario
from voice.audio.replay_device import UserClip
from voice.audio.wav import BadAudio, read_mono16k, write_wav


def sine(n: int, rate: int, freq: float = 440.0, amp: int = 10000) -> np.ndarray:
    t = np.arange(n) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def write_raw(path: Path, frames: bytes, *, channels: int, width: int, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(frames)


def one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert msg and "\n" not in msg, f"not a one-line message: {msg!r}"
    return msg


# -- read_mono16k --------------------------------------------------------------------


def test_16k_mono_round_trip(tmp_path):
    samples = np.concatenate([sine(8000, 16000), np.array([-32768, 32767, 0, -1], np.int16)])
    path = tmp_path / "a.wav"
    write_wav(path, samples, 16000)
    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 16000, 8004)
    got = read_mono16k(path)
    assert got.dtype == np.int16
    assert got.ndim == 1
    np.testing.assert_array_equal(got, samples)
    np.testing.assert_array_equal(read_mono16k(str(path)), samples)  # str paths too


def test_44k1_file_is_resampled_to_16k(tmp_path):
    n = 44100  # one second
    src = sine(n, 44100, freq=440.0)
    path = tmp_path / "cd.wav"
    write_wav(path, src, 44100)
    got = read_mono16k(path)
    assert got.dtype == np.int16
    assert abs(len(got) - n * 16000 / 44100) <= 1
    # Still a 440 Hz sine of the same loudness.
    ref = sine(len(got), 16000, freq=440.0)
    rms = lambda x: float(np.sqrt(np.mean(x[500:-500].astype(np.float64) ** 2)))  # noqa: E731
    assert rms(got) == pytest.approx(rms(ref), rel=0.03)
    spectrum = np.abs(np.fft.rfft(got.astype(np.float64)))
    peak_hz = np.argmax(spectrum) * 16000 / len(got)
    assert abs(peak_hz - 440) < 3


def test_other_target_rate(tmp_path):
    path = tmp_path / "a.wav"
    write_wav(path, sine(16000, 16000), 16000)
    got = read_mono16k(path, rate=48000)
    assert abs(len(got) - 48000) <= 1


def test_stereo_is_refused_with_the_sox_fix(tmp_path):
    frames = np.zeros((100, 2), np.int16).tobytes()
    path = tmp_path / "stereo.wav"
    write_raw(path, frames, channels=2, width=2, rate=16000)
    with pytest.raises(BadAudio) as info:
        read_mono16k(path)
    msg = one_line(info.value)
    assert "2 channels" in msg
    assert "mono" in msg
    assert "sox stereo.wav -c 1 out.wav" in msg
    assert isinstance(info.value, ValueError)


def test_8_bit_is_refused(tmp_path):
    path = tmp_path / "eight.wav"
    write_raw(path, bytes(range(100)), channels=1, width=1, rate=16000)
    with pytest.raises(BadAudio) as info:
        read_mono16k(path)
    msg = one_line(info.value)
    assert "8-bit" in msg
    assert "16-bit" in msg
    assert "sox eight.wav -b 16 out.wav" in msg


def test_random_bytes_are_not_a_readable_wav(tmp_path):
    path = tmp_path / "noise.wav"
    path.write_bytes(np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(BadAudio) as info:
        read_mono16k(path)
    msg = one_line(info.value)
    assert "not a readable WAV" in msg
    assert str(path) in msg


def test_empty_file_is_not_a_readable_wav(tmp_path):
    path = tmp_path / "empty.wav"
    path.write_bytes(b"")
    with pytest.raises(BadAudio, match="not a readable WAV"):
        read_mono16k(path)


def test_truncated_mid_sample_is_bad_audio(tmp_path):
    """A file cut off in the middle of a sample (odd number of data bytes)
    must be reported as BadAudio, not leak numpy's buffer error."""
    path = tmp_path / "cut.wav"
    write_wav(path, np.arange(1, 101, dtype=np.int16), 16000)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(BadAudio) as info:
        read_mono16k(path)
    assert "cut.wav" in one_line(info.value)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.wav"
    with pytest.raises(BadAudio) as info:
        read_mono16k(path)
    msg = one_line(info.value)
    assert msg == f"audio file not found: {path}"


# -- load_scenario ----------------------------------------------------------------------


def clip(path: Path, lead_s: float = 0.3, loud_s: float = 0.5) -> np.ndarray:
    lead = np.zeros(int(round(lead_s * 16000)), np.int16)
    loud = sine(int(loud_s * 16000), 16000, freq=300.0, amp=8000)
    loud[0] = 8000  # the first sample after the silence is already loud
    samples = np.concatenate([lead, loud, np.zeros(1600, np.int16)])
    write_wav(path, samples, 16000)
    return samples


VALID = """
tail = 2.5
max_duration = 60
stt_model = "tiny.en"

[[user]]
audio = "ask.wav"
at = 0.5

[[user]]
audio = "sub/stop.wav"
barge_in_after = 2.4

[[tool]]
name = "lookup"
wait_s = 8
result = "London: capital of the United Kingdom."

[[reply]]
chunk_delay_ms = 40
text = "Let me look that up."
tool_calls = [{ name = "lookup", arguments = { topic = "London" } }]

[[reply]]
text = "All right."
"""


@pytest.fixture
def scenario_dir(tmp_path):
    (tmp_path / "sub").mkdir()
    clip(tmp_path / "ask.wav", lead_s=0.3)
    clip(tmp_path / "sub" / "stop.wav", lead_s=0.1)
    return tmp_path


def write_scenario(directory: Path, text: str) -> Path:
    path = directory / "scenario.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_valid_scenario_parses(scenario_dir):
    path = write_scenario(scenario_dir, VALID)
    sc = load_scenario(path)
    assert isinstance(sc, Scenario)
    assert sc.path == path
    assert (sc.tail, sc.max_duration, sc.stt_model, sc.llm) == (2.5, 60.0, "tiny.en", None)

    assert len(sc.users) == 2
    ask, stop = sc.users
    assert isinstance(ask, UserClip)
    assert (ask.name, ask.when, ask.seconds) == ("ask.wav", "at", 0.5)
    assert (stop.name, stop.when, stop.seconds) == ("sub/stop.wav", "barge_in_after", 2.4)
    assert ask.onset == 4800
    assert stop.onset == 1600
    assert ask.audio.dtype == np.int16
    assert len(ask.audio) == 4800 + 8000 + 1600
    assert ask.duration == pytest.approx(14400 / 16000)

    assert sc.tools == (ScenarioTool("lookup", 8.0, "London: capital of the United Kingdom.", "read"),)
    assert sc.replies is not None and len(sc.replies) == 2
    first, second = sc.replies
    assert first.text == "Let me look that up."
    assert first.chunk_delay_ms == 40
    assert [c.name for c in first.tool_calls] == ["lookup"]
    assert second.text == "All right."


def test_defaults_and_after_reply(scenario_dir):
    path = write_scenario(
        scenario_dir,
        '[[user]]\naudio = "ask.wav"\nat = 0\n[[user]]\naudio = "ask.wav"\nafter_reply = 0.8\n',
    )
    sc = load_scenario(path)
    assert (sc.tail, sc.max_duration, sc.stt_model, sc.replies, sc.llm, sc.tools) == (1.5, 180.0, None, None, None, ())
    assert [(u.when, u.seconds) for u in sc.users] == [("at", 0.0), ("after_reply", 0.8)]


def test_llm_scripted_file_and_model_name(scenario_dir):
    (scenario_dir / "replies.toml").write_text('[[reply]]\ntext = "Hi."\n', encoding="utf-8")
    sc = load_scenario(write_scenario(scenario_dir, 'llm = "scripted:replies.toml"\n[[user]]\naudio = "ask.wav"\nat = 1\n'))
    assert sc.llm is None
    assert [r.text for r in sc.replies] == ["Hi."]
    sc = load_scenario(write_scenario(scenario_dir, 'llm = "some-model"\n[[user]]\naudio = "ask.wav"\nat = 1\n'))
    assert sc.llm == "some-model"
    assert sc.replies is None


def test_onset_of_a_silent_clip_is_zero(scenario_dir):
    write_wav(scenario_dir / "quiet.wav", np.full(1600, 400, np.int16), 16000)  # below the threshold
    sc = load_scenario(write_scenario(scenario_dir, '[[user]]\naudio = "quiet.wav"\nat = 0\n'))
    assert sc.users[0].onset == 0


USER_OK = '[[user]]\naudio = "ask.wav"\nat = 0.5\n'


@pytest.mark.parametrize(
    "text, needles",
    [
        ("tail = \n", ["not valid TOML"]),
        ('color = "blue"\n' + USER_OK, ["unknown key", "'color'"]),
        ("[[user]]\nat = 0.5\n", ["[[user]] 1", "audio"]),
        ('[[user]]\naudio = "ask.wav"\nat = 0.5\nbarge_in_after = 1\n', ["[[user]] 1", "exactly one of"]),
        ('[[user]]\naudio = "ask.wav"\n', ["[[user]] 1", "exactly one of"]),
        ('[[user]]\naudio = "ask.wav"\nbarge_in_after = 1\n', ["first [[user]]", "at = SECONDS"]),
        (USER_OK + '[[user]]\naudio = "ask.wav"\nafter_reply = 1\nvolume = 3\n', ["[[user]] 2", "unknown key", "'volume'"]),
        ("tail = 1.0\n", ["no [[user]]"]),
        ('[[reply]]\ntext = "hi"\n', ["no [[user]]"]),
        (USER_OK + "[[tool]]\nwait_s = 3\n", ["[[tool]] 1", "name"]),
        (USER_OK + '[[tool]]\nname = "x"\ncolour = 1\n', ["[[tool]] 1", "name"]),
        ('[user]\naudio = "ask.wav"\nat = 0.5\n', ["[[user]]"]),  # a table, not an array of tables
        ("user = 3\n", ["user"]),
        ('[[user]]\naudio = "missing.wav"\nat = 0.5\n', ["missing.wav", "not found"]),
        (USER_OK + '[[reply]]\ntext = "hi"\nvoice = "x"\n', ["reply 1", "unknown key"]),
        (USER_OK + '[[reply]]\ntext = "hi"\n[[play]]\nmessage = "1.0.0"\nsentence = 0\nat_s = 1\n',
         ["[[play]] 1", '"1.0.0" names no [[reply]]', "no reply has one"]),
        (USER_OK + '[[reply]]\nmessage = "1.0"\ntext = "hi"\n', ["reply 1", "TURN.STEP.ATTEMPT"]),
        (USER_OK + '[[say]]\ntext = "hi"\n', ["[[say]] 1", "text = \"WORDS\" and at = SECONDS"]),
        (USER_OK + '[[say]]\ntext = 5\nat = 1\n', ["[[say]] 1 text = 5", "quoted string"]),
    ],
    ids=[
        "bad-toml",
        "unknown-top-key",
        "user-without-audio",
        "user-two-timing-keys",
        "user-no-timing-key",
        "first-user-not-at",
        "unknown-user-key",
        "no-user-at-all",
        "replies-but-no-user",
        "tool-without-name",
        "tool-unknown-key",
        "user-as-single-table",
        "user-not-a-table",
        "user-audio-missing",
        "bad-reply",
        "play-of-no-reply",
        "reply-message-not-an-id",
        "say-without-at",
        "say-text-not-a-string",
    ],
)
def test_scenario_errors(scenario_dir, text, needles):
    path = write_scenario(scenario_dir, text)
    with pytest.raises(ValueError) as info:
        load_scenario(path)
    msg = one_line(info.value)
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_missing_scenario_file(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(ValueError) as info:
        load_scenario(path)
    assert one_line(info.value) == f"scenario not found: {path}"


def test_bad_toml_names_the_file(tmp_path):
    path = write_scenario(tmp_path, "[[user]\n")
    with pytest.raises(ValueError) as info:
        load_scenario(path)
    msg = one_line(info.value)
    assert str(path) in msg and "not valid TOML" in msg


def test_non_utf8_scenario(tmp_path):
    path = tmp_path / "scenario.toml"
    path.write_bytes(b'tail = "\xff\xfe"\n')
    with pytest.raises(ValueError, match="not valid TOML"):
        load_scenario(path)
