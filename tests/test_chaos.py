"""Issue #11, deliverable 6: kill -9 at every commit point of a turn, with
tool calls from every kind of provider, restarting on the same log each
time. Each `voice chat` is a real process that SIGKILLs itself right after
the N-th event of its turn is committed (tests/killpoint.py); the next one
recovers the log and runs its own turn, to be killed one commit later.

Asserted over the whole log: one `turn/end` per turn, one result per call,
no id used twice, no write run twice (each note text is in the notes file
at most once, and exactly when its effect is confirmed), and no start that
fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from killpoint import killpoints_fixture
from loopback_llm import LoopbackLLM
from voice.log import events as ev
from voice.log.store import EventStore

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


killpoints = killpoints_fixture()


@pytest.fixture(scope="module")
def llm() -> Iterator[LoopbackLLM]:
    with LoopbackLLM(ids="repeat") as server:  # "call_0" in every response: the worst a server does
        yield server


def setup(tmp: Path, provider: str, llm: LoopbackLLM):
    """(argv for note k, the line the person says for note k)."""
    config = tmp / "voice.toml"
    config.write_text('[llm]\nbase_url = "http://127.0.0.1:9/v1"\n')  # nothing answers: the offline skills
    db = str(tmp / "ev.db")

    def argv(k: int) -> list[str]:
        if provider == "skills":
            return ["chat", "--db", db, "--config", str(config)]
        if provider == "openai":
            return ["chat", "--db", db, "--llm", llm.base_url]
        script = tmp / f"note{k}.toml"  # a read and a write in one message, then a reply
        script.write_text('[[reply]]\nchunk_delay_ms = 0\n[[reply.tool_calls]]\nname = "get_time"\n'
                          f'[[reply.tool_calls]]\nname = "add_note"\narguments = {{ text = "note {k}" }}\n'
                          '[[reply]]\nchunk_delay_ms = 0\ntext = "Saved."\n')
        return ["chat", "--db", db, "--llm", f"scripted:{script}"]

    def line(k: int) -> str:
        return f"note: note {k}\n" if provider == "openai" else f"add a note note {k}\n"

    return argv, line


@pytest.mark.parametrize("provider", ["skills", "scripted", "openai"])
def test_kill_at_every_commit_point(tmp_path, provider, killpoints, llm):
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_DATA_HOME": str(tmp_path / "data"),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "HF_HUB_OFFLINE": "1"}
    argv, line = setup(tmp_path, provider, llm)
    clean = killpoints.run(argv(0), env=env, out=tmp_path / "run0", stdin=line(0))
    assert clean["rc"] == 0, clean["stderr"]
    points = clean["commits"]  # the commits of one whole turn, turn/start to turn/end
    assert points >= 10, clean
    for k in range(1, points + 1):
        run = killpoints.run(argv(k), env=env, out=tmp_path / f"run{k}", stdin=line(k), kill_after=k)
        assert run["signal"] == 9 and run["commits"] == k, (k, run)  # every start worked; killed where asked
    final = killpoints.run(argv(points + 1), env=env, out=tmp_path / "last", stdin=line(points + 1))
    assert final["rc"] == 0 and "Traceback" not in final["stderr"], final["stderr"]

    store = EventStore(tmp_path / "ev.db")
    try:
        events = store.events()
    finally:
        store.close()
    starts = [(e.conversation, e.turn) for e in events if e.type == ev.TURN_START]
    ends = Counter((e.conversation, e.turn) for e in events if e.type == ev.TURN_END)
    assert len(starts) == points + 2 and ends == Counter(starts), "a turn without exactly one end"
    outcomes = [e.payload["outcome"] for e in events if e.type == ev.TURN_END]
    assert outcomes.count(ev.COMPLETED) == 3  # the clean runs and the one killed after its turn/end
    calls = [e.payload["tool_call_id"] for e in events if e.type == ev.TOOL_CALL]
    assert len(calls) == len(set(calls)), "a tool-call id was used twice"
    results = Counter(e.payload["tool_call_id"] for e in events if e.type == ev.TOOL_RESULT)
    assert set(results) == set(calls) and set(results.values()) == {1}

    notes_file = tmp_path / "data" / "voice" / "notes.txt"
    written = Counter(row.partition("\t")[2] for row in notes_file.read_text().splitlines())
    assert max(written.values()) == 1, f"a write ran twice: {written}"
    effects = json.loads(subprocess.run([sys.executable, "-m", "voice", "effects", "--json", "--db",
                                         str(tmp_path / "ev.db")], cwd=ROOT, env=env, capture_output=True,
                                        text=True, timeout=60).stdout)
    for effect in effects:  # what the log says of each write is what the file shows
        assert (effect["outcome"] == ev.CONFIRMED) == (effect["arguments"]["text"] in written), effect
    assert len(written) == len(effects) - sum(e["outcome"] == ev.FAILED for e in effects)
