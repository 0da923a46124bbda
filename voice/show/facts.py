"""The page around the picture (voice.show.page draws the picture): its
title, the reply's words with what was heard, the barge-in, tool and
latency tables, what the log could not tell, and the HTML shell (no
JavaScript, nothing fetched: its Content-Security-Policy forbids it)."""

from __future__ import annotations

import html
import re

from voice.show.style import MARK_STYLE
from voice.show.timeline import TurnTimeline


def inline_svg(svg: str, titles: dict[str, str]) -> str:
    """matplotlib's SVG made fit for inlining: no XML prolog, a width that
    follows the page, and a <title> (a tooltip) in each drawn part."""
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1 id="turn-picture" role="img"', svg, count=1)
    for gid, title in titles.items():
        svg = svg.replace(f'<g id="{gid}">', f'<g id="{gid}">\n<title>{html.escape(title)}</title>', 1)
    return svg


def turn_title(t: TurnTimeline, with_utterance: bool = True) -> str:
    outcome = "stopped by the person" if t.aborted else (t.outcome or "open")
    said = f" · “{shortened(t.utterance.text, 60)}”" if with_utterance and t.utterance and t.utterance.text else ""
    return f"Turn {t.turn} · {outcome}{said}"


def shortened(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def seconds_text(seconds: float | None) -> str:
    return f"{seconds:.2f} s" if seconds is not None else "—"


def facts_html(t: TurnTimeline) -> str:
    e = html.escape
    out = ['<section id="reply"><h2>The reply</h2>']
    if t.words:
        spans = []
        for w in t.words:
            tip = e(f"{w.state}" + (f", {w.start_s:.2f}–{w.end_s:.2f} s" if w.start_s is not None else ""))
            if w.heard:
                spans.append(f'<span class="heard" title="{tip}">{e(w.text)}</span>')
            else:
                spans.append(f'<s class="{w.state}" title="{tip}">{e(w.text)}</s>')
        out.append(f'<p id="reply-words">{" ".join(spans)}</p>')
    elif t.reply_text:
        out.append(f'<p id="reply-text">{e(t.reply_text)}</p>')
    out.append(f'<p id="delivered"><b>Delivered, as the log recorded it:</b> '
               f'{"“" + e(t.delivered) + "”" if t.delivered else "nothing"}'
               f'{" <b>(stopped)</b>" if t.aborted else ""}</p></section>')
    if t.marks:
        out.append(_table("barge-in", "Barge-in", ("mark", "at", "speech onset", "after the onset", "why"), [
            (MARK_STYLE[m.kind][2], f"{m.at_s:.3f} s", seconds_text(m.onset_s),
             "" if m.ack_ms is None else f"{m.ack_ms:.0f} ms", m.reason or "") for m in t.marks]))
    if t.tools:
        out.append(_table("tools", "Tool calls", ("tool", "arguments", "dispatched", "result", "status", "receipt"), [
            (c.name, c.arguments, seconds_text(c.dispatch_s), seconds_text(c.result_s), c.status or "", c.receipt or "")
            for c in t.tools]))
    parts = t.latency.parts()
    if parts:
        out.append(_table("latency", "Latency", ("part", "took"),
                          [(t.latency.label(name), f"{(end - start) * 1000:.0f} ms") for name, start, end in parts]))
    if t.gaps:
        items = "".join(f"<li>{e(g)}</li>" for g in t.gaps)
        out.append(f'<section id="gaps"><h2>Not in this log</h2><ul>{items}</ul></section>')
    return "\n".join(out)


def _table(section: str, heading: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<section id="{section}"><h2>{heading}</h2><table><tr>{head}</tr>{body}</table></section>'


PAGE_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>{title}</title>
<style>
body {{ font-family: "DejaVu Sans", sans-serif; margin: 1.5em; color: #222; }}
h1 {{ font-size: 1.3em; }} h2 {{ font-size: 1.05em; margin-top: 1.4em; }}
#turn-picture {{ width: 100%; height: auto; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }}
.heard {{ background: #d6e8fa; }} s {{ color: #888; }}
</style>
</head>
<body>
<h1>{title}</h1>
<figure id="picture">
{svg}
</figure>
{facts}
</body>
</html>
"""
