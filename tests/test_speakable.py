"""Speakable text (voice/speech/speakable.py): what the synthesizer reads for
Markdown, links and units, and the map from spoken words back to the model's
own characters that a cut relies on."""

from __future__ import annotations

import re

import pytest

from model_replies import REAL_REPLIES
from voice.speech.speakable import SpeakableStream, render

# (source as a model writes it, what the synthesizer should read)
CASES = [
    ("## Inner planets", "Inner planets."),
    ("### Why? ###", "Why?"),
    ("1. **Mercury** is *tiny* and about 58 km/s fast.", "1, Mercury is tiny and about 58 kilometers per second fast."),
    ("- **Venus**: 465°C at the surface", "Venus: 465 degrees Celsius at the surface"),
    ("* item one", "item one"),
    ("+ [x] done task", "done task"),
    ("> quoted **3.5 km** away", "quoted 3.5 kilometers away"),
    ("It is __very__ ~~not~~ ***really*** _so_.", "It is very not really so."),
    ("Run `voice doctor` first.", "Run voice doctor first."),
    ("Read [the guide](https://example.org/guide \"Guide\") now.", "Read the guide now."),
    ("![a red planet](mars.png)", "a red planet"),
    ("See https://en.wikipedia.org/wiki/Mercury_(planet) for more.", "See en dot wikipedia dot org for more."),
    ("Go to www.example.com/a/b, then <https://docs.python.org/3/>.", "Go to example dot com, then docs dot python dot org."),
    ("It costs $3.50, not $3.", "It costs 3 dollars 50, not 3 dollars."),
    ("A $1 coin and €2.5 million and £40k.", "A 1 dollar coin and 2.5 million euros and 40 thousand pounds."),
    ("Earth is 1 AU away; light takes 8.3 min.", "Earth is 1 astronomical unit away; light takes 8.3 minutes."),
    ("About 150 million km away", "About 150 million kilometers away"),
    ("Speed 100 km/h or 62 mph, weight 1,200 kg.", "Speed 100 kilometers per hour or 62 miles per hour, weight 1,200 kilograms."),
    ("It's 72°F, 20% humid, 1 m of snow.", "It's 72 degrees Fahrenheit, 20% humid, 1 meter of snow."),
    ("Meet at 10:30 on the 3rd, about 5-10 people.", "Meet at 10:30 on the 3rd, about 5 to 10 people."),
    ("Roughly ~40 GB -> 2 TB.", "Roughly about 40 gigabytes to 2 terabytes."),
    ("Set my_timer_name to 5.", "Set my timer name to 5."),
    ("2 * 3 = 6 🚀", "2 times 3 = 6"),
    ("Line one<br>line two", "Line oneline two"),
    ("Use a \\*literal\\* star \\(sic\\).", "Use a literal star (sic)."),
    ("| Planet | Moons |", "Planet Moons"),
    ("---", ""),
    ("|---|:--:|", ""),
    ("The 2024-05-01 release", "The 2024-05-01 release"),
    ("Plain text, no markup.", "Plain text, no markup."),
]


REAL_LINES = [line for reply in REAL_REPLIES for line in reply.splitlines() if line.strip()]


def _norm(words) -> list[str]:
    """Words as a listener tells them apart: no punctuation around them."""
    out = [re.sub(r"^\W+|\W+$", "", w) for w in words]
    return [w for w in out if w]


def _words(spoken) -> list[str]:
    return _norm(w.text for w in spoken.words)


@pytest.mark.parametrize("source,said", CASES, ids=[c[0][:30] for c in CASES])
def test_rendering(source, said):
    assert render(source).text == said


@pytest.mark.parametrize("source", [c[0] for c in CASES] + REAL_LINES, ids=[c[0][:30] for c in CASES] + [
    f"real-{i}" for i in range(len(REAL_LINES))])
def test_every_spoken_prefix_maps_to_exactly_its_source(source):
    """For each count of fully played words, the delivered source prefix is
    well formed (never ends inside a token or in whitespace), grows with the
    words and never holds the source of a word not yet heard. A heard word
    is left out only while the source it is read from is not fully said
    (inside "58 km/s", "58 kilometers" delivers "58": km/s needs all three
    words), and once all is said, all is delivered."""
    spoken = render(source)
    words = spoken.words
    previous = 0
    for k in range(len(words) + 1):
        cut = words[k - 1].source_end if k else 0
        prefix = source[:cut]
        assert cut >= previous, f"the prefix shrank at word {k}"
        previous = cut
        assert prefix == prefix.rstrip(), f"{prefix!r} ends in whitespace"
        if 0 < cut < len(source):
            assert not (source[cut - 1].isalnum() and source[cut].isalnum()), f"{prefix!r} cuts a word"
        again = _words(render(prefix))
        heard = [_norm([w.text]) for w in words[:k]]
        flat = [x for ws in heard for x in ws]
        assert again == flat[: len(again)], f"{prefix!r} says {again}, but only {flat} played"
        # Words heard but not in the prefix: none of them completed its source.
        said = 0
        for j, ws in enumerate(heard):
            said += len(ws)
            if said > len(again):
                assert all(w.source_end == cut for w in words[j:k]), (
                    f"after {flat} the prefix {prefix!r} says only {again}")
                break
    assert not render(source[previous:]).words, "the full reading leaves source unsaid"


def test_a_cut_inside_formatted_text_records_exactly_the_heard_words():
    source = "The probe is **3.5 km** away."
    spoken = render(source)
    assert spoken.text == "The probe is 3.5 kilometers away."
    end_of = {w.text: w.end for w in spoken.words}
    # Synthesizer word timings carry char_end offsets into the spoken text.
    assert source[: spoken.source_chars(end_of["3.5"])] == "The probe is **3.5"
    assert source[: spoken.source_chars(end_of["kilometers"])] == "The probe is **3.5 km**"
    assert source[: spoken.source_chars(end_of["3.5"] + 3)] == "The probe is **3.5"  # mid-word: not yet
    assert spoken.source_chars(0) == 0


def test_a_unit_read_as_several_words_is_delivered_only_when_all_played():
    spoken = render("about 58 km/s fast")
    cut = {w.text: "about 58 km/s fast"[: w.source_end] for w in spoken.words}
    assert cut["58"] == cut["kilometers"] == cut["per"] == "about 58"
    assert cut["second"] == "about 58 km/s"


def _stream(text: str, chunk: int):
    stream = SpeakableStream()
    out = []
    for i in range(0, len(text), chunk):
        out += stream.feed(text[i : i + chunk])
    return out + stream.close()


@pytest.mark.parametrize("chunk", [1, 2, 5, 13])
@pytest.mark.parametrize("reply", range(len(REAL_REPLIES)))
def test_streamed_sentences_do_not_depend_on_how_the_text_arrives(reply, chunk):
    whole = _stream(REAL_REPLIES[reply], 100_000)
    got = _stream(REAL_REPLIES[reply], chunk)
    assert [(s.source_start, s.source_end, s.text) for s in got] == [
        (s.source_start, s.source_end, s.text) for s in whole
    ]


@pytest.mark.parametrize("reply", range(len(REAL_REPLIES)))
def test_a_real_reply_reads_without_markup_and_maps_into_the_whole_reply(reply):
    text = REAL_REPLIES[reply]
    sentences = _stream(text, 3)
    said = " ".join(s.text for s in sentences)
    assert not re.search(r"[*#`\[\]]|https?:|\w/\w", said), said
    for a, b in zip(sentences, sentences[1:]):
        assert a.source_end <= b.source_start
    for s in sentences:
        assert text[s.source_start : s.source_end] == s.spoken.source[: s.source_end - s.source_start]
        for w in s.spoken.words:  # every delivered prefix ends inside the reply, on its own text
            assert s.source_start < s.delivered_chars(w.end) <= s.source_end
    # List numbers and abbreviations do not end a sentence on their own.
    assert all(not re.fullmatch(r"\d+,?", s.text) for s in sentences)


def test_what_the_real_replies_sound_like():
    said = [" ".join(s.text for s in _stream(reply, 7)) for reply in REAL_REPLIES]
    assert "Here's how to do it: Step 1: Boil the Egg To boil an egg" in said[0]
    assert "1, Boil an egg in a kettle or double boiler for 2 minutes." in said[0]
    assert "To convert to miles per hour: 1 kilometer per second times 5.67" in said[1]
    assert "To convert to kilometers per second, multiply by 2: 27,031,849 meters per second divided by 2" in said[1]
    assert said[2] == "1, Python 2, Django (Laravel) 3, Codecademy"
    assert "Here's a simple example: Example of a for loop" in said[3]
    assert "This will output: Loop executed" in said[3]


def test_sentence_ends_are_those_a_listener_hears():
    texts = [s.text for s in _stream("Use e.g. a timer. Then stop!\n- one\n- two. Three\n", 4)]
    assert texts == ["Use e.g. a timer.", "Then stop!", "one", "two.", "Three"]


def test_code_fences_are_silent_and_code_is_read_line_by_line():
    reply = "Run this:\n```sh\n# check\nvoice doctor --json\n```\nDone."
    sentences = _stream(reply, 3)
    assert [s.text for s in sentences] == ["Run this:", "check", "voice doctor --json", "Done."]
    assert reply[sentences[2].source_start : sentences[2].source_end] == "voice doctor --json"


@pytest.mark.slow
def test_the_synthesizer_reads_no_markup_symbols():
    """piper's own phonemizer (espeak-ng) on the spoken text: none of the
    symbol names the issue heard ('hash', 'asterisk', 'slash')."""
    from piper import PiperVoice

    from voice.speech import models

    model, config = models.piper_joe()
    voice = PiperVoice.load(model, config_path=config)

    def phonemes(text: str) -> str:
        return " ".join("".join(s) for s in voice.phonemize(text))

    symbols = {name: phonemes(name) for name in ("hash", "asterisk", "slash", "backtick", "tilde")}
    for source in [c[0] for c in CASES] + REAL_REPLIES:
        said = " ".join(s.text for s in _stream(source, 7))
        heard = phonemes(said)
        for name, sound in symbols.items():
            assert sound not in heard, f"{source!r} is read with {name!r}: {said!r}"
