"""First clause first: where the first sentence of a reply may be cut so
that synthesis starts before the model has finished the sentence.

A reply's first audio waits for its first sentence: from the model (tokens
streamed) and then from Piper (a longer text takes longer). When that
sentence opens with a clause of at least `MIN_CLAUSE_WORDS` words ended by
a comma, semicolon, colon or dash, the clause is spoken on its own. Shorter
clauses ("First," "Yes,") are not: said alone they sound clipped, and they
save little. Only the first sentence of a reply is cut: once audio plays,
the next sentences are ready long before they are due.
"""

from __future__ import annotations

import re

MIN_CLAUSE_WORDS = 5  # about 1.5 s of speech: a phrase that sounds natural on its own
# A clause ends at , ; : before whitespace, or at a dash between spaces; a
# comma inside a number ("3,000") is not followed by whitespace.
_CLAUSE_END = re.compile(r"[,;:][\"')\]]*\s+|\s[-\u2013\u2014]+\s+")
_SENTENCE_END = re.compile(r"[.!?]")
_WORD = re.compile(r"\w+(?:['\u2019]\w+)*")


def first_clause_end(text: str, start: int = 0, min_words: int = MIN_CLAUSE_WORDS) -> int | None:
    """The offset in `text` just after the first clause that begins at
    `start`, if it is long enough and no sentence ends before it; None to
    wait for more text (or for the sentence end)."""
    m = _CLAUSE_END.search(text, start)
    if m is None or _SENTENCE_END.search(text, start, m.start()):
        return None
    if len(_WORD.findall(text, start, m.start())) < min_words:
        return None
    return m.end()
