"""The turn picture: from a `TurnTimeline` (filled from a real log) to the
page's SVG and the PNG. The SVG is read as XML: each drawn part has an id
(and a tooltip), text stays text."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from io import BytesIO

import pytest
from PIL import Image

from show_log import CONVERSATION, HEARD, TURN, write_turn
from voice.log.store import EventStore
from voice.show.load import from_log
from voice.show.page import DPI, page_html, png_bytes

SVG = "{http://www.w3.org/2000/svg}"


def timeline(tmp_path, *, proposed: bool = True):
    written = write_turn(tmp_path, proposed=proposed)
    store = EventStore(tmp_path / "events.db")
    try:
        return from_log(store, CONVERSATION, TURN, mic=written.mic, speaker=written.speaker, summary=written.summary)
    finally:
        store.close()


def svg_of(page: str) -> ET.Element:
    return ET.fromstring(page[page.index("<svg"):page.index("</svg>") + 6])


def groups(svg: ET.Element) -> dict[str, ET.Element]:
    return {g.get("id"): g for g in svg.iter(f"{SVG}g") if g.get("id")}


def texts(element: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in element.iter(f"{SVG}text")]


def fill(element: ET.Element) -> str:
    text = next(element.iter(f"{SVG}text"))
    return re.search(r"fill: (#[0-9a-f]{6})", text.get("style", "")).group(1)


@pytest.fixture
def full(tmp_path):
    t = timeline(tmp_path)
    return t, page_html(t)


def test_the_picture_has_every_part(full):
    t, page = full
    ids = groups(svg_of(page))
    for part in ("mic-waveform", "speaker-waveform", "wake-word", "utterance", "transcript", "speech-region-0",
                 "speech-region-2", "onset-0", "onset-1", "tool-0", "footer",
                 "latency-0", "latency-1", "latency-2", "latency-3"):
        assert part in ids, part
    assert "Take a note and tell me about the sea." in " ".join(texts(ids["transcript"]))
    assert "add_note" in page and "receipt confirmed" in page
    # every drawn part named in the tooltips has one
    assert ids["mic-waveform"].find(f"{SVG}title").text.startswith("microphone: 0.00–")


def test_heard_words_are_drawn_apart_from_words_that_never_played(full):
    t, page = full
    ids = groups(svg_of(page))
    heard = [i for i in ids if re.fullmatch(r"word-\d+-heard", i)]
    assert len(heard) == len(HEARD)
    assert [i for i in ids if re.fullmatch(r"word-\d+-cut", i)] == [f"word-{len(HEARD)}-cut"]
    unheard = [i for i in ids if re.fullmatch(r"word-\d+-(queued|unsaid)", i)]
    assert unheard and all(fill(ids[i]) == "#9a9a9a" for i in unheard)  # grey (and struck through)
    shown = [texts(ids[i])[0] for i in unheard] + (["…"] if "unheard-more" in ids else [])
    assert shown[0] == "is"  # the words after the cut, in order
    assert ids[heard[0]].find(f"{SVG}title").text == "“Let” 4.00–4.25 s, heard"
    assert "<s class=\"queued\"" in page and "<s class=\"unsaid\"" in page  # the page's text: struck too


def test_barge_in_marks_show_the_acknowledgement_in_ms(full):
    t, page = full
    svg = svg_of(page)
    labels = [" ".join(texts(g)) for i, g in groups(svg).items() if i.startswith("marks-label-")]
    assert labels == ["pause +50 ms", "resume +550 ms", "pause +100 ms", "confirm + cut +600 ms"]
    ids = groups(svg)
    for kind in ("mark-pause-0", "mark-resume-1", "mark-pause-2", "mark-confirm-3", "mark-clear-4"):
        assert kind in ids
    assert "cut at 9.320 s after the speech onset at 8.70 s" in ids["mark-clear-4"].find(f"{SVG}title").text


def test_the_delivered_prefix_is_shown_as_the_log_recorded_it(full):
    t, page = full
    footer = " ".join(texts(groups(svg_of(page))["footer"]))
    assert f"delivered (as the log recorded it): “{t.delivered}”" in footer
    assert re.search(r'id="delivered".*“' + re.escape(t.delivered) + "”", page)


def test_todays_log_draws_the_delivered_prefix_without_word_times(tmp_path):
    page = page_html(timeline(tmp_path, proposed=False))
    ids = groups(svg_of(page))
    assert "delivered-span" in ids and not any(re.fullmatch(r"word-\d+-\w+", i) for i in ids)
    assert texts(ids["unheard-0"]) == ["it"]  # the rest of the reply, struck, after the pause
    assert "not in this log: word play times" in " ".join(texts(ids["footer"]))


def test_the_page_is_self_contained(full):
    _, page = full
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "@import" not in page and "url(http" not in page


def test_the_png_is_the_same_picture(full):
    t, page = full
    png = Image.open(BytesIO(png_bytes(t)))
    width_pt, height_pt = map(float, svg_of(page).get("viewBox").split()[2:])
    # the same size to within the text's own width: Agg measures glyphs, the SVG keeps text as text
    assert png.size == pytest.approx((width_pt * DPI / 72, height_pt * DPI / 72), rel=0.01)
    assert page_html(t) == page  # the same timeline draws the same page
