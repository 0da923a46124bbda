"""The real-human speech fixtures (tests/fixtures/audio/human): index.json
describes the files that are there, the set holds what turn-taking and
barge-in work needs, and Whisper base (the assistant's own recogniser) hears
each transcript, so the transcripts in the index can be trusted."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from heard import whisper, word_errors
from voice.audio.wav import read_mono16k

pytestmark = pytest.mark.slow

HUMAN = Path(__file__).parent / "fixtures" / "audio" / "human"
INDEX = json.loads((HUMAN / "index.json").read_text())
FILES = INDEX["files"]
MAX_WER = 0.4  # a sanity bound: the transcript is right, not a score for Whisper (archaic
# "Feed'st thy light's flame" is heard "feet by light flame": 0.375)


def _source_key(entry: dict) -> str:
    return next(k for k, s in INDEX["sources"].items() if s["name"] == entry["source"]["package"])


def test_index_lists_exactly_the_wav_files():
    assert sorted(e["file"] for e in FILES) == sorted(p.name for p in HUMAN.glob("*.wav"))


@pytest.mark.parametrize("entry", FILES, ids=[e["file"] for e in FILES])
def test_file_matches_its_index_entry(entry):
    with wave.open(str(HUMAN / entry["file"]), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
        frames = w.getnframes()
        samples = np.frombuffer(w.readframes(frames), "<i2")
    assert frames == round(entry["duration_s"] * 16000)
    start, end = entry["speech_s"]
    assert start == INDEX["padding_s"]
    assert end == pytest.approx(entry["duration_s"] - INDEX["padding_s"], abs=0.011)
    for pause in entry["pauses_energy"] + entry["pauses_silero"]:
        assert start < pause[0] < pause[1] < end + 0.05, pause
    peak = 20 * np.log10(np.abs(samples.astype(np.int32)).max() / 32768)
    assert peak == pytest.approx(entry["peak_dbfs"], abs=0.1)
    assert peak <= INDEX["level"]["peak_ceiling_dbfs"] + 0.05
    assert entry["split"] in ("tune", "held-out")
    assert entry["kind"] in ("utterance", "fragment")
    assert entry["speaker"] in INDEX["speakers"]
    source = INDEX["sources"][_source_key(entry)]
    assert (source["name"], source["version"]) == (entry["source"]["package"], entry["source"]["version"])
    assert entry["license"] == source["license"]


@pytest.mark.filterwarnings("ignore:'audioop' is deprecated:DeprecationWarning")  # pipecat's import, not ours
def test_the_pauses_in_the_index_are_what_silero_hears():
    maker = _fixture_maker()
    for entry in FILES:
        audio = read_mono16k(HUMAN / entry["file"]).astype(np.float32) / 32768
        assert maker.silero_pauses(audio) == entry["pauses_silero"], entry["file"]


def _fixture_maker():
    spec = importlib.util.spec_from_file_location("make_human_fixtures", HUMAN / "make_human_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_set_holds_what_turn_taking_and_barge_in_tests_need():
    utterances = [e for e in FILES if e["kind"] == "utterance"]
    assert len(utterances) >= 20
    assert len([e for e in FILES if e["barge_in"]]) >= 5
    mid_pause = [e for e in utterances if any(b - a > 0.25 for a, b in e["pauses_silero"])]
    assert len(mid_pause) >= 4
    assert {INDEX["speakers"][e["speaker"]]["sex"] for e in FILES} == {"female", "male"}
    for split in ("tune", "held-out"):
        assert len([e for e in utterances if e["split"] == split]) >= 8


def test_no_recording_is_in_both_splits():
    """A clip may reuse audio of its own split (a fragment of an utterance) but
    never audio of the other split: held-out stays unseen."""
    for a in FILES:
        for b in FILES:
            if a["split"] == b["split"] or a["source"]["member"] != b["source"]["member"]:
                continue
            a0, a1 = a["source"]["window_s"]
            b0, b1 = b["source"]["window_s"]
            assert (a1 or 1e9) <= b0 or (b1 or 1e9) <= a0, (a["file"], b["file"])


# -- the transcripts ---------------------------------------------------------------

ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen " \
       "seventeen eighteen nineteen".split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    """0-9999 as words, as Whisper's digits are said ("33" -> "thirty three")."""
    if n >= 1000:
        return f"{ONES[n // 1000]} thousand" + (f" {number_words(n % 1000)}" if n % 1000 else "")
    if n >= 100:
        return f"{ONES[n // 100]} hundred" + (f" {number_words(n % 100)}" if n % 100 else "")
    if n >= 20:
        return TENS[n // 10] + (f" {ONES[n % 10]}" if n % 10 else "")
    return ONES[n]


def normalised_words(text: str) -> list[str]:
    text = text.lower().replace("’", "'").replace("-", " ").replace("mr.", "mister")
    text = re.sub(r"\d+", lambda m: f" {number_words(int(m.group()))} ", text)
    return re.findall(r"[a-z']+", text)


def test_number_words_and_normalising():
    assert normalised_words("33 -4692, Mr. Ill-disposed") == \
        "thirty three four thousand six hundred ninety two mister ill disposed".split()
    assert word_errors("a b c".split(), "a x c d".split()) == 2


def test_whisper_base_hears_each_transcript():
    rates = {}
    for entry in FILES:
        audio = read_mono16k(HUMAN / entry["file"]).astype(np.float32) / 32768
        reference = normalised_words(entry["transcript"])
        heard = normalised_words(whisper().transcribe(audio).text)
        rates[entry["file"]] = (word_errors(reference, heard) / len(reference), " ".join(heard))
    mean = sum(r for r, _ in rates.values()) / len(rates)
    print(f"\nWhisper base WER on {len(rates)} human fixtures: mean {mean:.3f}")
    for name, (rate, heard) in sorted(rates.items(), key=lambda kv: -kv[1][0]):
        print(f"  {rate:.2f} {name}: {heard}")
    too_far = {name: r for name, r in rates.items() if r[0] > MAX_WER}
    assert not too_far, f"transcripts Whisper base does not hear (WER > {MAX_WER}): {too_far}"
