"""The turn page as a person sees it: opened by a real headless Chromium
(Debian's `chromium`; .ci/run installs it), screenshotted, its DOM dumped
and its console read. Skips, saying why, where Chromium is not installed or
cannot start here; a page that Chromium renders badly fails."""

from __future__ import annotations

import re
import shutil
import subprocess
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from show_log import CONVERSATION, HEARD, TURN, write_turn
from voice.log.store import EventStore
from voice.show.load import from_log
from voice.show.style import HEARD as HEARD_FILL
from voice.show.page import write_html

WINDOW = (1400, 1500)


class Chromium:
    def __init__(self, binary: str, profile_root: Path):
        self.binary, self.profile_root, self.runs = binary, profile_root, 0

    def run(self, page: Path, *args: str) -> tuple[str, list[str]]:
        """stdout, and the page's console messages (errors, CSP violations, logs)."""
        self.runs += 1
        profile = self.profile_root / f"profile-{self.runs}"  # a fresh profile each time
        result = subprocess.run(
            [self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--hide-scrollbars",
             f"--window-size={WINDOW[0]},{WINDOW[1]}", *args, page.as_uri()],
            capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"chromium exited {result.returncode}: {result.stderr.strip()[-500:]}")
        return result.stdout, [line for line in result.stderr.splitlines() if ":CONSOLE" in line]

    def screenshot(self, page: Path, out: Path) -> tuple[Image.Image, list[str]]:
        _, console = self.run(page, f"--screenshot={out}")
        return Image.open(BytesIO(out.read_bytes())).convert("RGB"), console

    def dom(self, page: Path) -> tuple[str, list[str]]:
        return self.run(page, "--dump-dom")


@pytest.fixture(scope="module")
def chromium(tmp_path_factory) -> Chromium:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("Chromium is not installed: apt-get install -y chromium (.ci/run installs it)")
    root = tmp_path_factory.mktemp("chromium")
    browser = Chromium(binary, root)
    probe = root / "probe.html"
    probe.write_text("<!doctype html><title>probe</title><p>probe</p>")
    try:
        dom, _ = browser.dom(probe)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"Chromium cannot run here: {exc}")
    if "<p>probe</p>" not in dom:
        pytest.skip(f"Chromium runs but renders nothing here (its DOM dump was {dom[:200]!r})")
    return browser


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("page")
    written = write_turn(root / "log")
    store = EventStore(root / "log" / "events.db")
    try:
        timeline = from_log(store, CONVERSATION, TURN, mic=written.mic, speaker=written.speaker)
    finally:
        store.close()
    out = root / "turn.html"
    write_html(timeline, out)
    return out


def test_the_page_renders_without_console_errors(chromium, page):
    dom, console = chromium.dom(page)
    assert console == []
    assert re.search(r'<svg[^>]*id="turn-picture"', dom)
    for part in ("mic-waveform", "speaker-waveform", "utterance", "tool-0", "latency-0"):
        assert f'id="{part}"' in dom, part
    assert len(re.findall(r'<g id="word-\d+-heard">', dom)) == len(HEARD)  # the word timeline
    assert 'id="word-{}-cut"'.format(len(HEARD)) in dom
    assert "pause +100 ms" in dom


def test_the_screenshot_shows_the_picture(chromium, page, tmp_path):
    shot, console = chromium.screenshot(page, tmp_path / "turn.png")
    assert console == []
    assert shot.size == WINDOW
    plot = np.asarray(shot)[60:800, 40:-40].astype(int)  # the figure, under the heading
    assert plot.std() > 20, "the plot area is blank"

    def share(rgb: str, tolerance: int = 12) -> float:
        colour = np.array([int(rgb[i:i + 2], 16) for i in (1, 3, 5)])
        return float((np.abs(plot - colour).max(axis=2) <= tolerance).mean())

    assert share("#1f77b4") > 0.002, "no speaker waveform"
    assert share("#555f6b") > 0.002, "no microphone waveform"
    assert share(HEARD_FILL) > 0.002, "no heard words"


def test_a_script_error_would_be_caught(chromium, tmp_path):
    """The console check above can fail: a page with a script error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><title>bad</title><script>throw new Error('drawn badly')</script>")
    _, console = chromium.dom(bad)
    assert any("drawn badly" in line for line in console)


# -- the README demo's cut turn, drawn by the command line from a real replay ----------

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    """`voice replay examples/barge-in --show`, then `voice show` on its cut turn
    (real processes, real models)."""
    import json
    import sys

    root = tmp_path_factory.mktemp("demo")
    out = root / "replay"
    done = subprocess.run([sys.executable, "-m", "voice", "replay", str(REPO / "examples/barge-in/scenario.toml"),
                           "--out", str(out), "--show"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    (cut,) = [t for t in summary["turns"] if t["status"] == "aborted"]
    assert f"drew turn {cut['turn']}: {out}/turn-{cut['turn']}.html" in done.stdout  # --show: the cut turn only
    assert sorted(p.name for p in out.glob("turn-*")) == [f"turn-{cut['turn']}.html", f"turn-{cut['turn']}.png"]
    page, png = root / "turn.html", root / "turn.png"
    shown = subprocess.run([sys.executable, "-m", "voice", "show", str(cut["turn"]), "--db", str(out / "events.db"),
                            "--out", str(page), "--png", str(png)], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == "", "the demo's log holds every part of the picture"  # no "not in the log" lines
    return {"page": page, "png": png, "turn": cut, "replay_page": out / f"turn-{cut['turn']}.html"}


@pytest.mark.slow  # `voice replay` of the demo, with the speech models
def test_voice_show_draws_the_demo_cut_turn_and_chromium_renders_it(chromium, demo, tmp_path):
    dom, console = chromium.dom(demo["page"])
    assert console == []
    for part in ("mic-waveform", "speaker-waveform", "utterance", "transcript", "speech-region-0", "latency-0",
                 "mark-pause-0", "mark-confirm-1", "mark-clear-2"):  # numbered in time order
        assert re.search(f'<g id="{part}"', dom), part
    delivered = demo["turn"]["delivered_text"].split()
    assert len(re.findall(r'<g id="word-\d+-heard">', dom)) == len(delivered)  # the words that played, placed
    assert re.search(r'<g id="word-\d+-(cut|queued)">', dom), "the word the cut fell in, or the queued rest"
    assert demo["replay_page"].read_text() == demo["page"].read_text()  # --show and voice show draw the same
    shot, console = chromium.screenshot(demo["page"], tmp_path / "shot.png")
    assert console == [] and np.asarray(shot)[60:800, 40:-40].astype(int).std() > 20
    png = Image.open(demo["png"])
    assert png.format == "PNG" and png.size[0] > 800
