"""benchmarks/llm_v2v.py's long-conversation mode, in its tiny variant,
against each real llama.cpp server (tests/llm_server.py): the benchmark's
whole path (its own server, `voice chat` driven through stdin and stdout,
the server's log read back per turn) so the 200-turn run cannot rot. On
llama-server (`--jinja`) the tool schemas `voice chat` sends go through the
model's template, and later turns still reuse the conversation's prefix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm_server import KINDS, kind_marks, kind_params

# Its own server and three model replies: a minute idle, many at a load of 10 on 2 cores.
pytestmark = [*kind_marks(), pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind", kind_params(*KINDS))
def test_the_long_conversation_mode_reports_each_turns_first_character_and_evaluated_tokens(kind, tmp_path):
    out, csv = tmp_path / "long.json", tmp_path / "long.csv"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "llm_v2v.py"), "--turns", "3", "--pause-s", "0.2",
                           "--server", kind, "--json", str(out), "--csv", str(csv)], cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    turns = result["per_turn"]
    assert [t["turn"] for t in turns] == [1, 2, 3] and not result["stopped_early"]
    for t in turns:
        assert 0 < t["taken_ms"] <= t["first_char_ms"] <= t["reply_ms"] and t["reply"], t
        own = t["server"]["own"]
        assert own and own["evaluated_tokens"] >= 1 and own["prompt_eval_ms"] > 0, t
    # The server reuses the conversation's prefix from its cache: later turns evaluate only what is new.
    assert all(t["server"]["own"]["cached_tokens"] > 0 for t in turns[1:]), turns
    assert result["summary"]["turns"] == 2 and result["summary"]["first_char_ms"]["p50"] > 0  # turn 1 left out
    assert len(csv.read_text().splitlines()) == 4 and "first char p50" in proc.stdout
