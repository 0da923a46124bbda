"""First clause first (voice.speech.clauses): the first sentence of a reply
is spoken from its first clause when that clause has at least five words;
what is delivered stays word-exact across the cut."""

from __future__ import annotations

import pytest

from test_timeline import heard_of, words
from timeline import Timeline, at, barge_in, run_timeline
from voice.log import events as ev
from voice.speech.clauses import first_clause_end

LONG_CLAUSE = "When the tide comes in at night, the water covers all of the sand on the beach. Then it goes out again."


@pytest.mark.parametrize("text, clause", [
    ("When the tide comes in at night, the water", "When the tide comes in at night,"),
    ("Here is what I found out: the sea is", "Here is what I found out:"),
    ("The deepest point is very deep - eleven kilometres", "The deepest point is very deep -"),
    ("It is about 3,000 metres deep on average; the", "It is about 3,000 metres deep on average;"),
])
def test_a_long_first_clause_is_cut_after_its_mark(text, clause):
    end = first_clause_end(text)
    assert end is not None and text[:end].strip() == clause


@pytest.mark.parametrize("text", [
    "First, the sea covers most of the planet.",  # "First," is too short to say alone
    "Yes. When the tide comes in at night, the",  # a sentence ends first: the sentence rule cuts there
    "When the tide comes in at night,",  # the model has not gone past the comma yet
    "It is about 3,000 metres deep",  # a comma inside a number
])
def test_no_cut_for_a_short_clause_a_sentence_end_or_a_number(text):
    assert first_clause_end(text) is None


def test_the_first_clause_plays_alone_and_a_cut_after_it_stays_word_exact(tmp_path):
    o = run_timeline(Timeline(
        clips=[at(0.5, "three_points.wav", "Give me three points about the sea."),
               barge_in(2.0, "stop_only.wav", "Stop.")],
        replies=[{"text": LONG_CLAUSE, "chunk_delay_ms": 30}],
    ), tmp_path)
    synthesized = []
    for w in o.tts.words.values():
        if w.text not in synthesized:
            synthesized.append(w.text)
    assert synthesized[:2] == ["When the tide comes in at night,", "the water covers all of the sand on the beach."]
    reply = o.replies[1]
    assert reply.outcome == ev.ABORTED and reply.interrupted
    fully, _ = heard_of(o, LONG_CLAUSE)
    assert words(reply.delivered_text) == fully
    assert LONG_CLAUSE.startswith(reply.delivered_text) and "night, the" in reply.delivered_text  # past the cut
