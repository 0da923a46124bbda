"""Speakable text: what the synthesizer reads instead of the model's Markdown,
and a map from each spoken word back to the model's own characters.

Models write Markdown, URLs and unit abbreviations whatever the prompt says;
read as-is they come out as "hash hash", "asterisk" and "k m slash s". Here a
piece of source text becomes a `Spoken`: the text to synthesize (no Markdown
symbols, lists and links read as words, "58 km/s" as "58 kilometers per
second") and, for every spoken word, how much of the source is delivered once
that word has fully played. The delivered prefix therefore stays in the
model's own text (what history and the next request carry), and a cut inside
"**3.5 km**" after "three point five" records "**3.5", never "km".

Invariant: a source span and the spoken words made of it are delivered
together or not at all. Markup that says nothing ("**", "## ", "- ") goes with
the word it touches: opening markup with the word after it, closing markup
with the word before it.

Numbers, percentages, times ("10:30"), ordinals ("1st") and "e.g." are left
to the synthesizer's own reading (espeak-ng reads them well); only what it
misreads is rewritten.

`SpeakableStream` is the incremental form for a streamed reply: it is fed the
deltas and hands out sentences as soon as they are complete, each rendered
once, with offsets into the whole reply. Pure: no event loop, no I/O.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

from voice.speech.clauses import first_clause_end

# -- the result ---------------------------------------------------------------


@dataclass(frozen=True)
class SpokenWord:
    text: str  # a whitespace-free token of the spoken text, as a synthesizer splits it
    start: int  # offsets in the spoken text
    end: int
    source_end: int  # source characters delivered once this word (and all before it) played


@dataclass(frozen=True)
class Spoken:
    source: str
    text: str
    words: tuple[SpokenWord, ...]

    def source_chars(self, spoken_end: int) -> int:
        """How much of `source` the person has received once the spoken text
        up to offset `spoken_end` has played (e.g. a `WordTiming.char_end`)."""
        i = bisect_right([w.end for w in self.words], spoken_end)
        return self.words[i - 1].source_end if i else 0


@dataclass(frozen=True)
class SpokenSentence:
    """A sentence of a streamed reply: its place in the reply, and how to say it."""

    index: int
    source_start: int  # offsets in the whole reply text
    source_end: int
    spoken: Spoken

    @property
    def text(self) -> str:
        return self.spoken.text

    def delivered_chars(self, spoken_end: int) -> int:
        """Reply characters delivered once this sentence's spoken text up to
        `spoken_end` has played (the sentences before it fully played)."""
        return self.source_start + self.spoken.source_chars(spoken_end)


# -- rendering one piece of text ------------------------------------------------

# (singular, plural); the plural is used unless the number is exactly 1.
_UNITS: dict[str, tuple[str, str]] = {
    "km/s": ("kilometer per second", "kilometers per second"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "m/s": ("meter per second", "meters per second"),
    "mph": ("mile per hour", "miles per hour"),
    "km": ("kilometer", "kilometers"),
    "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"),
    "m": ("meter", "meters"),
    "mi": ("mile", "miles"),
    "ft": ("foot", "feet"),
    "kg": ("kilogram", "kilograms"),
    "mg": ("milligram", "milligrams"),
    "g": ("gram", "grams"),
    "lb": ("pound", "pounds"),
    "lbs": ("pound", "pounds"),
    "oz": ("ounce", "ounces"),
    "ml": ("milliliter", "milliliters"),
    "mL": ("milliliter", "milliliters"),
    "L": ("liter", "liters"),
    "ms": ("millisecond", "milliseconds"),
    "min": ("minute", "minutes"),
    "hrs": ("hour", "hours"),
    "TB": ("terabyte", "terabytes"),
    "GB": ("gigabyte", "gigabytes"),
    "MB": ("megabyte", "megabytes"),
    "kB": ("kilobyte", "kilobytes"),
    "KB": ("kilobyte", "kilobytes"),
    "GHz": ("gigahertz", "gigahertz"),
    "MHz": ("megahertz", "megahertz"),
    "kHz": ("kilohertz", "kilohertz"),
    "Hz": ("hertz", "hertz"),
    "kWh": ("kilowatt hour", "kilowatt hours"),
    "kW": ("kilowatt", "kilowatts"),
    "mAh": ("milliamp hour", "milliamp hours"),
    "AU": ("astronomical unit", "astronomical units"),
    "ly": ("light year", "light years"),
    "°C": ("degree Celsius", "degrees Celsius"),
    "°F": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°": ("degree", "degrees"),
}
_CURRENCIES = {"$": ("dollar", "dollars"), "€": ("euro", "euros"), "£": ("pound", "pounds")}
_MULTIPLIERS = {"k": "thousand", "K": "thousand", "m": "million", "M": "million", "bn": "billion", "B": "billion",
                "thousand": "thousand", "million": "million", "billion": "billion", "trillion": "trillion"}

_NUMBER = r"\d[\d,]*(?:\.\d+)?"
_UNIT_ALT = "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True))
_MULT_ALT = "|".join(sorted(_MULTIPLIERS, key=len, reverse=True))

# Inline rules, tried in this order at every position (leftmost match wins).
_INLINE = re.compile(
    rf"""
    (?P<code>(?P<ticks>`+)(?P<code_text>.+?)(?P=ticks))
  | (?P<image>!\[(?P<alt>[^\]]*)\]\([^)\s]*(?:\s+"[^"]*")?\))
  | (?P<link>\[(?P<link_text>[^\]]+)\]\([^)\s]*(?:\s+"[^"]*")?\))
  | (?P<autolink><(?P<auto_url>https?://[^>\s]+)>)
  | (?P<url>(?:https?://|www\.)(?:[^\s<>()]|\([^\s<>()]*\))*(?:[^\s<>().,;:!?'"\]*_]|\([^\s<>()]*\)))
  | (?P<money>(?P<cur>[$€£])\s?(?P<amount>{_NUMBER})(?:\s?(?P<mult>{_MULT_ALT})\b)?)
  | (?P<range>(?<![\d.,-])(?P<lo>\d{{1,4}})(?P<dash>[-–])(?P<hi>\d{{1,4}})(?![\d-]))
  | (?P<measure>(?<![\w.])(?P<num>[-+]?{_NUMBER}(?:\s(?:thousand|million|billion|trillion))?)(?P<gap>\s?)(?P<unit>{_UNIT_ALT})(?![^\W_]|/\w))
  | (?P<bare_unit>(?<![\w/])(?:km/s|km/h|m/s|mph|kph)(?![\w/]))
  | (?P<divided>(?<=\s)/(?=\s|$))
  | (?P<about>~(?=\s?\d)|≈)
  | (?P<arrow>->|=>|→|⇒)
  | (?P<escape>\\(?P<escaped>[\\`*_{{}}\[\]()#+\-.!|~<>]))
  | (?P<tag></?[a-zA-Z][^<>]*>)
  | (?P<emphasis>\*+|_+|~~)
  | (?P<word>[^\W_]+(?:['’._][^\W_]+)*)
  | (?P<space>\s+)
  | (?P<other>.)
    """,
    re.VERBOSE,
)

# Line rules: only where a piece of text starts a line.
_SILENT_LINE = re.compile(
    r"""^\s*(?:
        (?P<rule>([-*_])(?:\s*\2){2,})          # --- *** ___
      | (?P<fence>```|~~~)[^\n]*                # a code fence (its info string too)
      | (?P<table_rule>\|?(?:\s*:?-+:?\s*\|)+\s*:?-*:?)  # |---|:--:|
    )\s*$""",
    re.VERBOSE,
)
_HEADING = re.compile(r"^\s{0,3}#{1,6}(?:\s+|$)")
_HEADING_TAIL = re.compile(r"\s+#+\s*$")
_QUOTE = re.compile(r"^\s*(?:>\s?)+")
_BULLET = re.compile(r"^\s*[-*+•]\s+(?:\[[ xX]\]\s+)?")
_NUMBERED = re.compile(r"^\s*(?P<n>\d{1,3})[.)](?=\s)")
_ENDS_SENTENCE = re.compile(r"[.!?:;,]$")

Piece = tuple[int, int, str]  # source start, source end, what is said for it


def render(source: str, *, line_start: bool = True, code: bool = False) -> Spoken:
    """The speakable form of `source`: one sentence, one line or a few.
    `line_start`: the text begins a line, so list and heading markers count.
    `code`: the text is inside a code block: read as prose (no list or
    heading markers), its symbols dropped like any others."""
    pieces: list[Piece] = []
    if code:
        pieces = _inline_pieces(source, 0, 0, len(source))
    else:
        offset = 0
        for line in source.splitlines(keepends=True):
            pieces += _line_pieces(line, offset, line_start or offset > 0)
            offset += len(line)
    return _assemble(source, pieces)


def _line_pieces(line: str, offset: int, line_start: bool) -> list[Piece]:
    end = len(line)
    if not line_start:
        return _inline_pieces(line, offset, 0, end)
    if _SILENT_LINE.match(line):
        return [(offset, offset + end, "")]
    pieces: list[Piece] = []
    pos, heading = 0, False
    if m := _QUOTE.match(line):
        pieces.append((offset, offset + m.end(), ""))
        pos = m.end()
    if m := _HEADING.match(line, pos):
        heading = True
        pieces.append((offset + pos, offset + m.end(), ""))
        pos = m.end()
        if t := _HEADING_TAIL.search(line, pos):
            end = t.start()
    elif m := _BULLET.match(line, pos):
        pieces.append((offset + pos, offset + m.end(), ""))
        pos = m.end()
    elif m := _NUMBERED.match(line, pos):
        # "1. Mercury" is read "1, Mercury": the number says where in the list we are.
        pieces.append((offset + pos, offset + m.end(), f"{m['n']},"))
        pos = m.end()
    pieces += _inline_pieces(line, offset, pos, end)
    if end < len(line):  # the closing hashes of a heading, then the line end
        tail = len(line.rstrip())
        pieces += [(offset + end, offset + tail, ""), (offset + tail, offset + len(line), " ")]
    if heading:  # a heading is read as a sentence of its own: give it its pause
        spoken = "".join(p[2] for p in pieces).rstrip()
        if spoken and not _ENDS_SENTENCE.search(spoken):
            last = max(i for i, p in enumerate(pieces) if p[2].strip())
            pieces.insert(last + 1, (pieces[last][1], pieces[last][1], "."))
    return pieces


def _inline_pieces(text: str, offset: int, pos: int, end: int) -> list[Piece]:
    pieces: list[Piece] = []
    for m in _INLINE.finditer(text, pos, end):
        # The first rule whose group matched (lastgroup would name an inner group).
        kind = next(k for k in _RULES if m.group(k) is not None)
        pieces += _RULES[kind](m, offset, text)
    return pieces


def _one(m: re.Match, offset: int, said: str) -> list[Piece]:
    return [(offset + m.start(), offset + m.end(), said)]


def _plural(number: str, forms: tuple[str, str]) -> str:
    return forms[0] if number.lstrip("+-") in ("1", "1.0") else forms[1]


def _url_words(url: str) -> str:
    """A URL is read as its host: "en dot wikipedia dot org"."""
    host = re.sub(r"^(?:https?://)?(?:www\.)?", "", url).split("/", 1)[0].split(":", 1)[0]
    return " dot ".join(part for part in host.split(".") if part)


def _money(m: re.Match, offset: int, _text: str) -> list[Piece]:
    amount, mult, forms = m["amount"], m["mult"], _CURRENCIES[m["cur"]]
    if mult:
        said = f"{amount} {_MULTIPLIERS[mult]} {forms[1]}"
    else:
        whole, _, cents = amount.partition(".")
        said = f"{whole} {_plural(whole, forms)}"
        if cents.strip("0"):
            said += f" {cents}"
    return _one(m, offset, said)


def _measure(m: re.Match, offset: int, _text: str) -> list[Piece]:
    # The number is its own piece, so "58" is delivered once "fifty-eight" played.
    num_end = m.start("gap")
    return [
        (offset + m.start(), offset + num_end, m["num"]),
        (offset + num_end, offset + m.start("unit"), " "),
        (offset + m.start("unit"), offset + m.end(), _plural(m["num"], _UNITS[m["unit"]])),
    ]


def _range(m: re.Match, offset: int, _text: str) -> list[Piece]:
    return [
        (offset + m.start("lo"), offset + m.end("lo"), m["lo"]),
        (offset + m.start("dash"), offset + m.end("dash"), " to "),
        (offset + m.start("hi"), offset + m.end("hi"), m["hi"]),
    ]


def _emphasis(m: re.Match, offset: int, text: str) -> list[Piece]:
    before = text[m.start() - 1] if m.start() > 0 else " "
    after = text[m.end()] if m.end() < len(text) else " "
    if m.group() == "*" and before.isspace() and after.isspace():
        return _one(m, offset, " times ")  # "2 * 3"
    return _one(m, offset, "")


def _other(m: re.Match, offset: int, _text: str) -> list[Piece]:
    ch = m.group()
    if ch in "#`|[]" or unicodedata.category(ch) in ("So", "Sk", "Cf", "Co"):
        return _one(m, offset, " " if ch == "|" else "")  # emoji, stray markup, brackets, table bars
    return _one(m, offset, ch)


_RULES: dict[str, Callable[[re.Match, int, str], list[Piece]]] = {
    "code": lambda m, o, t: _one(m, o, m["code_text"].strip()),
    "image": lambda m, o, t: _one(m, o, render(m["alt"], line_start=False).text),
    "link": lambda m, o, t: _one(m, o, render(m["link_text"], line_start=False).text),
    "autolink": lambda m, o, t: _one(m, o, _url_words(m["auto_url"])),
    "url": lambda m, o, t: _one(m, o, _url_words(m.group())),
    "money": _money,
    "range": _range,
    "measure": _measure,
    "bare_unit": lambda m, o, t: _one(m, o, _UNITS[m.group()][1]),
    "divided": lambda m, o, t: _one(m, o, "divided by"),
    "about": lambda m, o, t: _one(m, o, "about "),
    "arrow": lambda m, o, t: _one(m, o, " to "),
    "escape": lambda m, o, t: _one(m, o, "" if m["escaped"] in "\\`*_#~|" else m["escaped"]),  # no symbol names
    "tag": lambda m, o, t: _one(m, o, ""),
    "emphasis": _emphasis,
    "word": lambda m, o, t: _one(m, o, m.group().replace("_", " ")),  # snake_case: two words, one unit
    "space": lambda m, o, t: _one(m, o, " "),
    "other": _other,
}


def _assemble(source: str, pieces: list[Piece]) -> Spoken:
    """Join the pieces into the spoken text (single spaces, trimmed) and give
    each spoken word the source prefix that is complete once it has played:
    the longest run of pieces, from the start, whose spoken text ends within
    the word. A silent piece sits where it falls in the spoken text, so
    closing markup ends with the word before it and opening markup (after a
    space) waits for the word after it."""
    spoken = ""
    ends: list[int] = []  # where each piece's spoken text ends
    for _, _, said in pieces:
        if not spoken or spoken[-1].isspace():
            said = said.lstrip()
        spoken += said
        ends.append(len(spoken))
    spoken = spoken.rstrip()
    words: list[SpokenWord] = []
    done, delivered = 0, 0
    for w in re.finditer(r"\S+", spoken):
        while done < len(pieces) and ends[done] <= w.end():
            start, end, _ = pieces[done]
            if source[start:end].strip():  # a prefix never ends in whitespace
                delivered = max(delivered, end)
            done += 1
        words.append(SpokenWord(w.group(), w.start(), w.end(), delivered))
    return Spoken(source, spoken, tuple(words))


# -- a streamed reply ------------------------------------------------------------

_SENTENCE_END = re.compile(r"[.!?]+[\"')\]*_~]*\s")
_ABBREVIATIONS = {"e.g", "i.e", "etc", "vs", "dr", "mr", "mrs", "ms", "st", "no", "approx", "fig", "cf"}
_LIST_MARKER_ONLY = re.compile(r"^\s*(?:[-*+]\s+)?(?:\d{1,3}|[a-zA-Z])[.)]\s$")


class SpeakableStream:
    """Feed it a reply's deltas; it returns each sentence once it is complete,
    rendered once. A sentence ends at a line end, or at ., ! or ? followed by
    whitespace (not after a list number, an abbreviation, or inside a code
    span or a link's brackets). Lines inside a code fence are read one by
    one, as prose; the fence lines themselves are silent.

    Sentences with nothing to say (a rule, a blank line) are not returned;
    their source lies between the sentences that are, so a delivered prefix
    that reaches past them includes them."""

    def __init__(self) -> None:
        self.text = ""
        self._cut = 0  # text before this has been handed out
        self._line_start = True  # self._cut is at the start of a line
        self._in_fence = False
        self._count = 0

    def feed(self, delta: str) -> list[SpokenSentence]:
        self.text += delta
        out: list[SpokenSentence] = []
        if self._count == 0 and (end := self._first_clause_end()) is not None:
            out += self._emit(end)  # first audio sooner (voice.speech.clauses)
        while (end := self._next_end()) is not None:
            out += self._emit(end)
        return out

    def close(self) -> list[SpokenSentence]:
        """The reply is complete: what is left is the last sentence."""
        return self._emit(len(self.text)) if self._cut < len(self.text) else []

    def _first_clause_end(self) -> int | None:
        """Where the reply's first sentence may be cut after its first clause:
        not in a code fence, not across a line, not inside a code span or a
        link's brackets."""
        end = first_clause_end(self.text, self._cut)
        if end is None or self._in_fence:
            return None
        before = self.text[self._cut : end]
        if "\n" in before or before.count("`") % 2 or before.count("[") > before.count("]") \
                or before.count("(") > before.count(")"):
            return None
        return end

    def _next_end(self) -> int | None:
        newline = self.text.find("\n", self._cut)
        limit = len(self.text) if newline < 0 else newline
        if not self._in_fence:
            for m in _SENTENCE_END.finditer(self.text, self._cut, limit + 1 if newline >= 0 else limit):
                if self._splits_at(m):
                    return m.end()
        return None if newline < 0 else newline + 1

    def _splits_at(self, m: re.Match) -> bool:
        before = self.text[self._cut : m.end()]
        if self._line_start and _LIST_MARKER_ONLY.match(before):
            return False
        word = re.search(r"([\w.]+)\.+[\"')\]*_~]*\s$", before)
        if word and word.group(1).lower() in _ABBREVIATIONS:
            return False
        line = before.rsplit("\n", 1)[-1]
        if line.count("`") % 2 or line.count("[") > line.count("]") or line.count("(") > line.count(")"):
            return False
        return True

    def _emit(self, end: int) -> list[SpokenSentence]:
        start, source = self._cut, self.text[self._cut : end]
        line_start = self._line_start
        self._cut = end
        self._line_start = source.endswith("\n")
        fence_line = line_start and bool(re.match(r"^\s*(?:```|~~~)", source))
        code = self._in_fence and not fence_line
        if fence_line:
            self._in_fence = not self._in_fence
        spoken = render(source, line_start=line_start, code=code)
        if not spoken.words:
            return []
        sentence = SpokenSentence(self._count, start, start + spoken.words[-1].source_end, spoken)
        self._count += 1
        return [sentence]
