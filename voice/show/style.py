"""The colours and line styles of `voice show`'s picture, shared by the
figure (voice.show.page) and the page's tables (voice.show.facts)."""

from __future__ import annotations

MARK_STYLE = {  # colour, line style, label
    "pause": ("#e67e00", (0, (4, 2)), "pause"),
    "confirm": ("#c0392b", (0, (1, 1.5)), "confirm"),
    "resume": ("#2e8b57", (0, (5, 2, 1, 2)), "resume"),
    "clear": ("#c0392b", "solid", "cut"),
}
HEARD, CUT, UNHEARD = "#d6e8fa", "#ffd8a8", "#9a9a9a"
LATENCY_COLOURS = ("#8fbc8f", "#87aecf", "#c9a0dc", "#f0b27a")  # as Latency.NAMES
