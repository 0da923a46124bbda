"""Draw a `TurnTimeline`: one self-contained HTML page, and a PNG of the
same picture for a bug report or the README.

Drawn with matplotlib, because one renderer gives both outputs: the page
inlines the figure as SVG (text kept as text, so it stays searchable and
sharp) and the PNG is the same figure through Agg. The page has no
JavaScript and fetches nothing (its Content-Security-Policy forbids it), so
it opens offline in any browser, and the PNG needs no browser at all.
Bokeh or Plotly would inline a megabyte or more of JavaScript into every
page and need a headless browser (or kaleido's bundled Chromium) to make a
PNG. matplotlib is 20 years old, released several times a year, and ships
manylinux wheels; it costs about 80 MB installed with its dependencies.

The figure, top to bottom, on one time axis (seconds on the device clock):
the microphone as captured (shaded where the VAD heard speech, the wake word,
the utterance with its transcript, the onsets of speech over the reply), the
speaker, the reply's words where they played (heard words boxed, the word
playing at the cut in orange, words that never played grey and struck
through, after the cut), the barge-in marks with the acknowledgement in ms,
tool calls with their receipts, and the latency parts as one stacked bar.
Barge-in marks are vertical lines through every row. Under the picture
(voice.show.facts): the delivered prefix as the log recorded it, and what
the log could not tell.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from io import BytesIO, StringIO
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from voice.show.facts import PAGE_HTML, facts_html, inline_svg, seconds_text, shortened, turn_title
from voice.show.style import CUT, HEARD, LATENCY_COLOURS, MARK_STYLE, UNHEARD
from voice.show.timeline import BargeInMark, Latency, TurnTimeline, Waveform

WIDTH_IN = 14.0
DPI = 100
COLUMNS = 1400  # waveform envelope resolution: one column per PNG pixel

_PLATE = {"boxstyle": "square,pad=0.15", "facecolor": "white", "edgecolor": "none"}  # text over the mark lines
_TIGHT = {"bbox_inches": "tight", "pad_inches": 0.15}  # the footer is below the axes
_STYLE = {"svg.fonttype": "none", "svg.hashsalt": "voice-show", "font.family": "DejaVu Sans", "font.size": 9}


def write_html(timeline: TurnTimeline, path: str | Path) -> None:
    Path(path).write_text(page_html(timeline), encoding="utf-8")


def write_png(timeline: TurnTimeline, path: str | Path) -> None:
    with _style():
        draw(timeline).figure.savefig(path, format="png", dpi=DPI, metadata={"Software": None}, **_TIGHT)


def page_html(timeline: TurnTimeline) -> str:
    with _style():
        drawing = draw(timeline)
        out = StringIO()
        drawing.figure.savefig(out, format="svg", metadata={"Date": None, "Creator": None}, **_TIGHT)
    svg = inline_svg(out.getvalue(), drawing.titles)
    return PAGE_HTML.format(title=html.escape(turn_title(timeline)), svg=svg, facts=facts_html(timeline))


def png_bytes(timeline: TurnTimeline) -> bytes:
    buf = BytesIO()
    with _style():
        draw(timeline).figure.savefig(buf, format="png", dpi=DPI, metadata={"Software": None}, **_TIGHT)
    return buf.getvalue()


@contextmanager
def _style() -> Iterator[None]:
    with matplotlib.rc_context(_STYLE):
        yield


# -- the figure ----------------------------------------------------------------


@dataclass
class Drawing:
    """The picture, and a tooltip for each drawn part, by its gid (the
    part's id in the SVG)."""

    figure: Figure
    titles: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        FigureCanvasAgg(self.figure)  # text extents need a renderer: labels are laid out by their measured width

    @property
    def renderer(self):
        return self.figure.canvas.get_renderer()

    def note(self, gid: str, title: str) -> None:
        self.titles[gid] = title


def draw(timeline: TurnTimeline) -> Drawing:
    """The picture of the turn, top to bottom as the module docstring says."""
    tools = max(1, len(timeline.tools))
    heights = [1.5, 1.2, 1.2, 0.55, 0.35 * tools + 0.25, 0.75]
    fig = Figure(figsize=(WIDTH_IN, sum(heights) + 1.0), dpi=DPI, layout="constrained")
    d = Drawing(fig)
    axes = fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights})
    mic_ax, speaker_ax, words_ax, marks_ax, tools_ax, latency_ax = axes
    labels = ("microphone\n(before echo\ncancellation)", "speaker\n(what played)", "reply words\nwhere they played",
              "barge-in\n(+ms from the\nVAD's onset)", "tool calls", "latency")
    for ax, label in zip(axes, labels):
        ax.set_xlim(timeline.window.start_s, timeline.window.end_s)
        ax.set_yticks([])
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=9)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    latency_ax.set_xlabel("seconds on the device clock")
    fig.suptitle(turn_title(timeline, with_utterance=False), x=0.01, ha="left", fontsize=12, fontweight="bold")
    fig.legend(handles=_legend(), loc="outside upper right", ncols=8, fontsize=8, frameon=False)
    # Lay the axes out once and keep them there, so that what is measured
    # below (label widths, the strike-through lines) stays where it was put.
    fig.draw_without_rendering()
    fig.set_layout_engine("none")

    _mic(d, mic_ax, timeline)
    _waveform(d, speaker_ax, timeline.speaker, "#1f77b4", "speaker-waveform", "speaker")
    _words(d, words_ax, timeline)
    _marks(d, axes, marks_ax, timeline.marks)
    _tools(d, tools_ax, timeline)
    _latency(d, latency_ax, timeline)
    footer = f"delivered (as the log recorded it): “{timeline.delivered}”" if timeline.delivered else \
        "delivered (as the log recorded it): nothing"
    lines = textwrap.wrap(footer, 170) + ["not in this log: " + gap for gap in timeline.gaps]
    bottom = latency_ax.get_tightbbox().transformed(fig.transFigure.inverted()).y0
    fig.text(0.01, bottom - 0.01, "\n".join(lines), ha="left", va="top", fontsize=8.5, color="#333", gid="footer")
    return d


def _legend() -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor="#2ca02c", alpha=0.16, label="speech (VAD)"),
               Patch(facecolor=HEARD, edgecolor="#1f77b4", label="heard"),
               Patch(facecolor=CUT, edgecolor="#e67e00", label="cut mid-word"),
               Line2D([], [], color=UNHEARD, label="not heard (struck)")]
    for colour, style, name in MARK_STYLE.values():
        handles.append(Line2D([], [], color=colour, linestyle=style, label=name))
    return handles


def _waveform(d: Drawing, ax, wave: Waveform | None, colour: str, gid: str, label: str) -> None:
    ax.set_ylim(-1.05, 1.05)
    if wave is None or len(wave.samples) == 0:
        ax.text(0.5, 0.5, "no recording", transform=ax.transAxes, ha="center", color=UNHEARD)
        return
    lo, hi = envelope(wave.samples, COLUMNS)
    x = np.linspace(wave.start_s, wave.end_s, len(lo))
    ax.fill_between(x, lo / 32768.0, hi / 32768.0, color=colour, linewidth=0.4, gid=gid)
    d.note(gid, f"{label}: {wave.start_s:.2f}–{wave.end_s:.2f} s, {wave.rate} Hz")


def _mic(d: Drawing, ax, timeline: TurnTimeline) -> None:
    _waveform(d, ax, timeline.mic, "#555f6b", "mic-waveform", "microphone")
    for n, span in enumerate(timeline.speech):
        gid = f"speech-region-{n}"
        ax.axvspan(span.start_s, span.end_s, color="#2ca02c", alpha=0.16, linewidth=0, gid=gid)
        d.note(gid, f"speech (VAD) {span.start_s:.2f}–{span.end_s:.2f} s")
    if timeline.wake_s is not None:
        ax.axvline(timeline.wake_s, color="#7d3c98", linewidth=1.5, gid="wake-word")
        ax.text(timeline.wake_s, -1.0, " wake word", color="#7d3c98", va="bottom", fontsize=8, bbox=_PLATE)
        d.note("wake-word", f"wake word at {timeline.wake_s:.2f} s")
    u = timeline.utterance
    if u is not None and u.start_s is not None and u.end_s is not None:
        ax.plot([u.start_s, u.start_s, u.end_s, u.end_s], [0.82, 0.92, 0.92, 0.82], color="#1e7b34",
                linewidth=1.5, gid="utterance", clip_on=False)
        ax.text(u.start_s, 0.97, f"“{u.text}”", color="#1e7b34", fontsize=10, va="bottom", fontweight="bold",
                clip_on=False, gid="transcript")
        d.note("utterance", f"utterance {u.start_s:.2f}–{u.end_s:.2f} s (end of turn decided): {u.text}")
    for n, mark in enumerate(m for m in timeline.marks if m.kind == "pause" and m.onset_s is not None):
        ax.plot([mark.onset_s], [-0.9], marker="^", color=MARK_STYLE["pause"][0], markersize=9,
                gid=f"onset-{n}", clip_on=False)
        d.note(f"onset-{n}", f"speech onset over the reply (VAD) at {mark.onset_s:.2f} s")


def _words(d: Drawing, ax, timeline: TurnTimeline) -> None:
    ax.set_ylim(0, 1)
    renderer = d.renderer
    if not timeline.words:
        _reply_as_text(d, ax, timeline)
        return
    rows: list[float] = [float("-inf")] * 2  # right edge (display px) of the last label in each row
    played = [(n, w) for n, w in enumerate(timeline.words) if w.start_s is not None]
    for n, word in played:
        gid = f"word-{n}-{word.state}"
        face, edge = (HEARD, "#1f77b4") if word.heard else (CUT, "#e67e00")
        ax.axvspan(word.start_s, word.end_s, ymin=0.42, ymax=0.96, facecolor=face, edgecolor=edge, linewidth=0.6,
                   gid=gid)
        d.note(gid, f"“{word.text}” {word.start_s:.2f}–{word.end_s:.2f} s, {word.state}")
        x_px = ax.transData.transform((word.start_s, 0))[0]
        row = next((r for r in range(len(rows)) if rows[r] < x_px), min(range(len(rows)), key=rows.__getitem__))
        label = ax.text(word.start_s, 0.83 - 0.27 * row, " " + word.text, fontsize=8.5, va="center",
                        color="black" if word.heard else "#a04000", clip_on=True)
        rows[row] = label.get_window_extent(renderer).x1 + 2
    after = max([w.end_s for _, w in played] + [m.at_s for m in timeline.marks if m.kind in ("pause", "clear")],
                default=timeline.window.start_s)
    unheard = [(n, w) for n, w in enumerate(timeline.words) if w.start_s is None]
    _flow_struck(d, ax, after, [(f"word-{n}-{w.state}", w.text, w.state) for n, w in unheard])


def _reply_as_text(d: Drawing, ax, timeline: TurnTimeline) -> None:
    """No word timings in the log: the delivered prefix as one bar from the
    first played sample to where the output stopped, the rest struck after it."""
    start = timeline.latency.first_audio_s
    stops = [m.at_s for m in timeline.marks if m.kind in ("pause", "clear")]
    if start is None or not timeline.reply_text:
        ax.text(0.5, 0.5, "no reply was played", transform=ax.transAxes, ha="center", color=UNHEARD)
        return
    end = min(stops) if stops else (timeline.speaker.end_s if timeline.speaker else timeline.window.end_s)
    if timeline.delivered:
        ax.axvspan(start, end, ymin=0.42, ymax=0.96, facecolor=HEARD, edgecolor="#1f77b4", linewidth=0.6,
                   gid="delivered-span")
        d.note("delivered-span", f"played {start:.2f}–{end:.2f} s (word times not in the log)")
        width = ax.transData.transform((end, 0))[0] - ax.transData.transform((start, 0))[0]
        text = _fit(ax, timeline.delivered, width, d.renderer)
        ax.text(start, 0.69, " " + text, fontsize=8.5, va="center", clip_on=True)
    rest = timeline.reply_text
    if timeline.delivered and rest.startswith(timeline.delivered):
        rest = rest[len(timeline.delivered):]
    words = rest.split() if (timeline.aborted or not timeline.delivered) else []
    _flow_struck(d, ax, end, [(f"unheard-{n}", w, "not heard") for n, w in enumerate(words)])


def _fit(ax, text: str, width_px: float, renderer) -> str:
    """`text` wrapped to two lines of `width_px` where it does not fit on one."""
    probe = ax.text(0, 0, text, fontsize=8.5)
    full = probe.get_window_extent(renderer).width
    probe.remove()
    if full <= width_px or width_px <= 0:
        return text
    per_line = max(10, int(len(text) * width_px / full) - 2)
    return "\n ".join(textwrap.wrap(text, per_line)[:2])


def _flow_struck(d: Drawing, ax, after_s: float, words: list[tuple[str, str, str]]) -> None:
    """Words that never played, as (gid, text, why): grey and struck through,
    in order, from `after_s` to the right edge on up to two lines (then a
    count of the rest)."""
    if not words:
        return
    renderer = d.renderer
    start_px = ax.transData.transform((after_s, 0))[0] + 6
    right = ax.transAxes.transform((1, 0))[0]
    to_data = ax.transData.inverted()
    lines, line, x_px = (0.24, 0.08), 0, start_px
    probe = ax.text(0, 0, f"… +{len(words)} words not heard", fontsize=8.5)
    reserve = probe.get_window_extent(renderer).width + 8  # room kept on the last line for the count
    probe.remove()
    for shown, (gid, word, why) in enumerate(words):
        y = lines[line]
        label = ax.text(to_data.transform((x_px, 0))[0], y, word, fontsize=8.5, va="center", color=UNHEARD,
                        gid=gid, clip_on=False)
        box = label.get_window_extent(renderer)
        if box.x1 > right and line + 1 < len(lines):  # wrap: the next line starts after the cut again
            line, x_px = line + 1, start_px
            y = lines[line]
            label.set_position((to_data.transform((x_px, 0))[0], y))
            box = label.get_window_extent(renderer)
        rest = len(words) - shown
        if box.x1 > right - reserve and rest > 1 and line + 1 == len(lines):
            label.set_text(f"… +{rest} words not heard")
            label.set_gid("unheard-more")
            d.note("unheard-more", "not heard: " + " ".join(w for _, w, _ in words[shown:]))
            break
        d.note(gid, f"“{word}”: not heard" + ("" if why == "not heard" else f" ({why})"))
        y_px = ax.transData.transform((0, y))[1]
        (x0, _), (x1, _) = to_data.transform([(box.x0, y_px), (box.x1, y_px)])
        ax.plot([x0, x1], [y, y], color=UNHEARD, linewidth=0.9, clip_on=False)  # struck through
        x_px = box.x1 + 5


def _marks(d: Drawing, axes, ax, marks: tuple[BargeInMark, ...]) -> None:
    ax.set_ylim(0, 1)
    if not marks:
        ax.text(0.5, 0.5, "no barge-in", transform=ax.transAxes, ha="center", color=UNHEARD)
        return
    for n, mark in enumerate(marks):
        colour, style, name = MARK_STYLE[mark.kind]
        gid = f"mark-{mark.kind}-{n}"
        for other in axes:
            other.axvline(mark.at_s, color=colour, linestyle=style, linewidth=1.6 if mark.kind == "clear" else 1.2,
                          gid=gid if other is ax else None)
        after = f" after the speech onset at {mark.onset_s:.2f} s" if mark.onset_s is not None else ""
        why = f" ({mark.reason})" if mark.reason else ""
        d.note(gid, f"{name} at {mark.at_s:.3f} s{after}{why}")
    renderer = d.renderer
    rows = [float("-inf")] * 2
    for n, group in enumerate(_together(ax, marks)):
        first = group[0]
        names = " + ".join(MARK_STYLE[m.kind][2] for m in group)
        ack = first.ack_ms
        label = names + (f" +{ack:.0f} ms" if ack is not None else "")
        x_px = ax.transData.transform((first.at_s, 0))[0]
        row = next((r for r in range(len(rows)) if rows[r] < x_px), min(range(len(rows)), key=rows.__getitem__))
        text = ax.text(first.at_s, 0.72 - 0.45 * row, label, color=MARK_STYLE[group[-1].kind][0], fontsize=8.5,
                       va="center", fontweight="bold", gid=f"marks-label-{n}", clip_on=False, bbox=_PLATE, zorder=5)
        rows[row] = text.get_window_extent(renderer).x1 + 4


def _together(ax, marks: tuple[BargeInMark, ...], px: float = 8) -> list[list[BargeInMark]]:
    """Marks drawn within a few pixels of each other share one label."""
    groups: list[list[BargeInMark]] = []
    for mark in sorted(marks, key=lambda m: m.at_s):
        x = ax.transData.transform((mark.at_s, 0))[0]
        if groups and x - ax.transData.transform((groups[-1][0].at_s, 0))[0] <= px:
            groups[-1].append(mark)
        else:
            groups.append([mark])
    return groups


def _tools(d: Drawing, ax, timeline: TurnTimeline) -> None:
    n_tools = max(1, len(timeline.tools))
    ax.set_ylim(n_tools, 0)
    if not timeline.tools:
        ax.text(0.5, 0.5, "no tool calls", transform=ax.transAxes, ha="center", color=UNHEARD)
        return
    for n, tool in enumerate(timeline.tools):
        gid = f"tool-{n}"
        outcome = ", ".join(p for p in (tool.status, f"receipt {tool.receipt}" if tool.receipt else None) if p)
        label = f"{tool.name}({shortened(tool.arguments, 50)}) → {outcome or 'no result'}"
        colour = {"confirmed": "#2e8b57", "failed": "#c0392b", "unknown": "#e67e00"}.get(tool.receipt or "", "#555")
        start = tool.dispatch_s if tool.dispatch_s is not None else tool.result_s
        if start is None:
            ax.text(0.01, n + 0.5, label + " (time not in the log)", transform=ax.get_yaxis_transform(),
                    va="center", fontsize=8.5, color=colour, gid=gid)
        else:
            end = tool.result_s if tool.result_s is not None else start
            ax.barh(n + 0.5, max(end - start, 0.02), left=start, height=0.6, color=colour, alpha=0.35, gid=gid)
            ax.text(end, n + 0.5, " " + label, va="center", fontsize=8.5, color=colour)
        d.note(gid, f"{tool.name} {tool.arguments}: dispatched {seconds_text(tool.dispatch_s)}, "
                        f"result {seconds_text(tool.result_s)}, {outcome or 'no result'}")


def _latency(d: Drawing, ax, timeline: TurnTimeline) -> None:
    ax.set_ylim(0, 1)
    parts = timeline.latency.parts()
    if not parts:
        ax.text(0.5, 0.5, "latency not known", transform=ax.transAxes, ha="center", color=UNHEARD)
        return
    renderer = d.renderer
    labels = []
    for n, (name, start, end) in enumerate(parts):
        gid = f"latency-{n}"
        ms = (end - start) * 1000
        colour = LATENCY_COLOURS[Latency.NAMES.index(name.split(" + ")[-1])]  # a part keeps its colour
        ax.barh(0.5, end - start, left=start, height=0.6, color=colour, edgecolor="white", gid=gid)
        shown = timeline.latency.label(name)
        d.note(gid, f"{shown}: {ms:.0f} ms ({start:.2f}–{end:.2f} s)")
        labels.append((f"{shown} {ms:.0f} ms", colour, start, end))
    inside = []
    for text, _, start, end in labels:
        label = ax.text((start + end) / 2, 0.5, text, ha="center", va="center", fontsize=8)
        (x0, _), (x1, _) = ax.transData.transform([(start, 0), (end, 0)])
        inside.append(label)
        if label.get_window_extent(renderer).width > x1 - x0 - 4:
            break
    else:
        return
    # Some part is too narrow for its label: all labels go in one line after
    # the bar, each behind a swatch of its part's colour.
    for label in inside:
        label.remove()
    x_px = ax.transData.transform((parts[-1][2], 0))[0] + 8
    to_data = ax.transData.inverted()
    total = (parts[-1][2] - parts[0][1]) * 1000
    for text, colour, _, _ in labels + [(f"= {total:.0f} ms", None, 0, 0)]:
        x = to_data.transform((x_px, 0))[0]
        label = ax.text(x, 0.5, ("■ " if colour else "") + text, va="center", fontsize=8.5, clip_on=False,
                        bbox=_PLATE, zorder=5)
        if colour:
            label.set_color("#222")
            swatch = ax.text(x, 0.5, "■", va="center", fontsize=8.5, color=colour, clip_on=False)
            swatch.set_zorder(6)
        x_px = label.get_window_extent(renderer).x1 + 10


# -- the page ----------------------------------------------------------------------


def envelope(samples: np.ndarray, columns: int) -> tuple[np.ndarray, np.ndarray]:
    """Min and max of each of `columns` equal slices: a waveform drawn at
    screen resolution instead of one point per sample."""
    if len(samples) == 0:
        return np.zeros(0), np.zeros(0)
    columns = max(1, min(columns, len(samples)))
    edges = np.linspace(0, len(samples), columns + 1).astype(int)[:-1]
    return np.minimum.reduceat(samples, edges), np.maximum.reduceat(samples, edges)
