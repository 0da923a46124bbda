"""docs/SCENARIOS.md is how a person writes a scripted-reply file and a
scenario. This keeps it from drifting: each example it shows is the shipped
file, word for word, and loads; its tables name every key the loaders allow,
and no other; `voice chat --help` points to it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from voice.agent.providers.scripted import _REPLY_KEYS, load_script
from voice.service import scenario as scenario_module
from voice.service.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "SCENARIOS.md"


def section(title: str) -> str:
    return DOC.read_text(encoding="utf-8").split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def examples() -> dict[str, str]:
    return dict(re.findall(r"^`([\w./-]+\.toml)`:\n\n```toml\n(.*?)^```$", DOC.read_text(encoding="utf-8"),
                           re.MULTILINE | re.DOTALL))


def table(title: str) -> dict[str, str]:
    """First cell (the key, brackets off) -> the rest of the row."""
    rows = {}
    for line in section(title).splitlines():
        if m := re.fullmatch(r"\| `\[{0,2}([a-z_]+)\]{0,2}` \| (.*) \|", line):
            rows[m[1]] = m[2]
    return rows


def test_the_examples_are_the_shipped_files_and_load():
    shown = examples()
    assert set(shown) == {"examples/demo-replies.toml", "examples/barge-in/scenario.toml"}
    for name, text in shown.items():
        assert (ROOT / name).read_text(encoding="utf-8") == text, f"docs/SCENARIOS.md shows another {name}"
    assert [r.text[:6] for r in load_script(ROOT / "examples" / "demo-replies.toml")] == [
        "Hello!", "First,", "", "I look"]
    demo = load_scenario(ROOT / "examples" / "barge-in" / "scenario.toml")
    assert [(u.name, u.when) for u in demo.users] == [("three_points.wav", "at"), ("stop.wav", "barge_in_after")]


def test_the_reply_table_names_every_key_a_reply_allows():
    assert set(table("Scripted replies")) == _REPLY_KEYS


@pytest.mark.parametrize("key, allowed", [
    ("user", scenario_module._USER), ("tool", scenario_module._TOOL), ("echo", scenario_module._ECHO),
    ("listen", {"mode", "window_s", "echo_cancellation"}), ("say", {"text", "at"}),
    ("play", {"message", "sentence", "at_s"}), ("control", {"command", "at"}), ("audio_lost", {"at", "into_reply", "back_after"}),
])
def test_the_scenario_table_names_every_key_and_each_tables_keys(key, allowed):
    rows = table("Scenarios")
    assert set(rows) == scenario_module._TOP
    assert set(re.findall(r"`([a-z_]+)`", rows[key])) >= allowed
    if key == "control":  # and every command a [[control]] may give
        assert set(re.findall(r'`"([a-z]+)"`', rows[key])) == set(scenario_module.CONTROLS)


def test_voice_chat_help_and_the_readme_point_to_it():
    done = subprocess.run([sys.executable, "-m", "voice", "chat", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "docs/SCENARIOS.md" in " ".join(done.stdout.split()), done.stdout
    assert "](docs/SCENARIOS.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
