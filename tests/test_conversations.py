"""Conversations that end (issue #14): on an idle gap, when the person asks,
on `voice ctl new`; the next request opens a new conversation; nothing is
deleted, timers outlive the conversation; a restart picks the right one."""

from __future__ import annotations

import copy

import pytest

from timeline import Timeline, after_reply, at, default_config, run_timeline
from voice.log import events as ev
from voice.log.conversations import ended, list_conversations, resume_or_new
from voice.log.projections import derive_messages
from voice.log.store import EventStore


def config_with(**conversation) -> dict:
    config = copy.deepcopy(default_config())
    config["conversation"].update(conversation)
    return config


def log_of(tmp_path):
    return EventStore(tmp_path / "events.db")


def test_a_conversation_ends_on_an_idle_gap_and_the_next_request_opens_a_new_one(tmp_path):
    outcome = run_timeline(Timeline(
        clips=[at(0.5, "what_time.wav", "What time is it?"),
               at(30.0, "three_points.wav", "Give me three points.")],
        replies=[{"text": "It is noon.", "chunk_delay_ms": 20}, {"text": "One, two, three.", "chunk_delay_ms": 20}],
    ), tmp_path, config_with(idle_gap_s=10.0))
    store = log_of(tmp_path)
    try:
        first, second = store.conversations()
        end = ended(store, first)
        assert end is not None and end.reason == "idle" and end.idle_s >= 10.0
        assert ended(store, second) is None and outcome.conversation == second
        # Nothing was deleted: the first is still there, and the second's model never saw it.
        assert [m["content"] for m in derive_messages(store, first)] == ["What time is it?", "It is noon."]
        assert [m["content"] for m in outcome.requests[1]] == ["Give me three points."] or \
            [m["content"] for m in outcome.requests[1] if m["role"] != "system"] == ["Give me three points."]
        listed = list_conversations(store)
        assert [(c.conversation, c.turns, c.ended, c.first_words) for c in listed] == [
            (first, 1, "idle", "What time is it?"), (second, 1, None, "Give me three points.")]
    finally:
        store.close()


def test_within_the_gap_the_conversation_goes_on(tmp_path):
    run_timeline(Timeline(
        clips=[at(0.5, "what_time.wav", "What time is it?"),
               at(12.0, "three_points.wav", "Give me three points.")],
        replies=[{"text": "It is noon.", "chunk_delay_ms": 20}, {"text": "One, two, three.", "chunk_delay_ms": 20}],
    ), tmp_path, config_with(idle_gap_s=30.0))
    store = log_of(tmp_path)
    try:
        assert len(store.conversations()) == 1
    finally:
        store.close()


def test_saying_start_over_ends_the_conversation_with_a_short_acknowledgement(tmp_path):
    outcome = run_timeline(Timeline(
        clips=[at(0.5, "what_time.wav", "What time is it?"),
               after_reply(0.8, "tell_london.wav", "Okay, start over."),
               after_reply(0.8, "three_points.wav", "Give me three points.")],
        replies=[{"text": "It is noon.", "chunk_delay_ms": 20}, {"text": "One, two, three.", "chunk_delay_ms": 20}],
    ), tmp_path)
    store = log_of(tmp_path)
    try:
        first, second = store.conversations()
        end = ended(store, first)
        assert end.reason == "asked" and end.words == "Okay, start over."
        # Not a request: no turn answered it, the model never saw it, and it was acknowledged aloud.
        assert [m["content"] for m in derive_messages(store, first)] == ["What time is it?", "It is noon."]
        assert "notice: Okay, starting fresh." in outcome.transcript
        assert [m["content"] for m in derive_messages(store, second)] == ["Give me three points.", "One, two, three."]
        assert len(outcome.requests) == 2
    finally:
        store.close()


def test_voice_ctl_new_ends_the_conversation_after_the_running_turn(tmp_path):
    ids = []

    async def new_after_the_first_turn(session) -> None:
        import anyio

        while not session.parts.turns.turns or session.parts.turns.turns[0].turn < 0:
            await anyio.sleep(0.05)
        ids.append(session.conversation)
        ids.append(await session.new_conversation())
        ids.append(await session.new_conversation())  # nothing said yet in the new one: it stays

    run_timeline(Timeline(
        clips=[at(0.5, "what_time.wav", "What time is it?"), at(6.0, "three_points.wav", "Give me three points.")],
        replies=[{"text": "It is noon.", "chunk_delay_ms": 20}, {"text": "One, two, three.", "chunk_delay_ms": 20}],
        during=new_after_the_first_turn,
    ), tmp_path)
    store = log_of(tmp_path)
    try:
        assert ids[0] != ids[1] == ids[2]
        assert ended(store, ids[0]).reason == "new"
        assert [m["content"] for m in derive_messages(store, ids[1])] == ["Give me three points.", "One, two, three."]
    finally:
        store.close()


# -- a restart ---------------------------------------------------------------


def talk(store, conversation: str, text: str = "hello") -> None:
    turn = store.start_turn(conversation, ev.TurnStart(source="voice"))
    store.record(conversation, ev.UserMessage(content=text), turn=turn)
    store.end_turn(conversation, turn, ev.COMPLETED)


def test_a_restart_continues_the_latest_conversation_within_the_gap(store):
    talk(store, "c-old")
    talk(store, "c-latest")
    last = store.last_of("c-latest", {ev.TURN_END}).at_wall
    assert resume_or_new(store, 900.0, now=last + 60) == "c-latest"
    assert ended(store, "c-latest") is None


def test_a_restart_after_the_gap_ends_it_and_starts_a_new_one(store):
    talk(store, "c-latest")
    last = store.last_of("c-latest", {ev.TURN_END}).at_wall
    new = resume_or_new(store, 900.0, now=last + 901)
    assert new != "c-latest" and new.startswith("c-")
    end = ended(store, "c-latest")
    assert end.reason == "idle" and end.idle_s >= 900


def test_a_restart_after_an_ended_conversation_starts_a_new_one(store):
    talk(store, "c-latest")
    store.record("c-latest", ev.ConversationEnd(reason="new"))
    assert resume_or_new(store, 900.0) != "c-latest"
    assert resume_or_new(log_of_empty(store), 900.0).startswith("c-")


def log_of_empty(store):
    return EventStore(store.path.with_name("empty.db"))


def test_a_timer_ringing_into_an_ended_conversation_does_not_reopen_it(store):
    talk(store, "c-latest")
    last = store.last_of("c-latest", {ev.TURN_END}).at_wall
    store.record("c-latest", ev.TimerFired(timer_id="t-1", text="Your tea timer is done."))
    # Only turns and stops are activity: a timer does not keep the conversation open.
    assert resume_or_new(store, 900.0, now=last + 1000) != "c-latest"


@pytest.mark.parametrize("value", [5, "soon"])
def test_a_bad_idle_gap_is_one_line_naming_the_key(tmp_path, value):
    import subprocess
    import sys

    cfg = tmp_path / "voice.toml"
    cfg.write_text(f"[conversation]\nidle_gap_s = {value!r}\n".replace("'", '"'))
    out = subprocess.run([sys.executable, "-m", "voice", "config", "show", "--config", str(cfg)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and "conversation.idle_gap_s" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def voice(*args: str, tmp_path) -> "subprocess.CompletedProcess[str]":
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_RUNTIME_DIR": str(tmp_path / "run"),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state")}
    return subprocess.run([sys.executable, "-m", "voice", *args], capture_output=True, text=True, timeout=60, env=env)


def test_voice_history_lists_every_conversation_and_shows_an_ended_one(tmp_path):
    db = tmp_path / "events.db"
    store = EventStore(db)
    talk(store, "c-first", "what time is it")
    store.record("c-first", ev.ConversationEnd(reason="idle", idle_s=1200.0))
    talk(store, "c-second", "set a timer")
    store.close()
    out = voice("history", "--list", "--db", str(db), tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first.startswith("c-first ") and "1 turns" in first and "ended: idle" in first and "what time is it" in first
    assert second.startswith("c-second ") and "open" in second
    listed = voice("history", "--list", "--json", "--db", str(db), tmp_path=tmp_path)
    assert [c["ended"] for c in __import__("json").loads(listed.stdout)] == ["idle", None]
    # An ended conversation stays readable.
    old = voice("history", "--conversation", "c-first", "--db", str(db), tmp_path=tmp_path)
    assert old.stdout.splitlines() == ["user: what time is it"]


def test_list_is_only_for_history(tmp_path):
    out = voice("ctl", "status", "--list", tmp_path=tmp_path)
    assert out.returncode != 0 and out.stderr.strip() == "voice: error: --list is for voice ctl history"


@pytest.mark.slow
def test_the_daemon_resumes_the_open_conversation_and_ctl_new_ends_it(tmp_path):
    """From the outside: `voice run` restarted continues the conversation it
    was in; `voice ctl new` ends it; the next restart does not reopen it."""
    from test_service import SCENARIOS, Daemon, ask
    from test_service import voice as voice_in

    scenario = tmp_path / "idle.toml"
    scenario.write_text(f'[[user]]\naudio = "{SCENARIOS.parent / "audio" / "what_time.wav"}"\nat = 0.3\n')

    def start() -> Daemon:
        (tmp_path / "notify.sock").unlink(missing_ok=True)  # the last one's
        d = Daemon(tmp_path, scenario)
        d.pump(lambda: "READY=1" in d.messages and d.socket.exists())
        return d

    d = start()
    try:
        d.pump(lambda: any(e.type == ev.TURN_END for e in d.events()))  # the spoken question was answered
        first = ask(d.socket, {"cmd": "status"})[0]["conversation"]
    finally:
        d.stop()
    d = start()
    try:
        assert ask(d.socket, {"cmd": "status"})[0]["conversation"] == first  # resumed: within the idle gap
        d.pump(lambda: len([e for e in d.events() if e.type == ev.TURN_END]) == 2)  # (its scenario asks again)
        out = voice_in(tmp_path, "ctl", "new")
        assert out.returncode == 0 and out.stdout.startswith("started a new conversation: c-") and f"({first} ended)" in out.stdout
        second = ask(d.socket, {"cmd": "status"})[0]["conversation"]
        assert second != first
        assert ask(d.socket, {"cmd": "say", "text": "what time is it"})[0]["ok"]
        listed = voice_in(tmp_path, "ctl", "history", "--list").stdout.splitlines()
        assert [line.split()[0] for line in listed] == [first, second]
        assert "ended: new" in listed[0] and "current" in listed[1]
    finally:
        d.stop()
    d = start()
    try:
        assert ask(d.socket, {"cmd": "status"})[0]["conversation"] == second  # the open one, not the ended one
    finally:
        d.stop()
# -- from the outside: a daemon, voice ctl -----------------------------------


@pytest.fixture(scope="module")
def gap_daemon(tmp_path_factory):
    """`voice run` with a 10 s idle gap, answering through a loopback model server."""
    from loopback_llm import LoopbackLLM
    from test_service import SCENARIOS, Daemon

    tmp = tmp_path_factory.mktemp("gap")
    (tmp / "config" / "voice").mkdir(parents=True)
    (tmp / "config" / "voice" / "voice.toml").write_text("[conversation]\nidle_gap_s = 10.0\n")
    scenario = tmp / "quiet.toml"
    scenario.write_text(f'[[user]]\naudio = "{SCENARIOS.parent / "audio" / "what_time.wav"}"\nat = 0.3\n')
    with LoopbackLLM() as server:
        d = Daemon(tmp, scenario, extra_args=("--llm", server.base_url))
        d.server = server
        try:
            d.pump(lambda: "READY=1" in d.messages and d.socket.exists())
            d.pump(lambda: any(e.type == ev.TURN_END for e in d.events()))
            yield d
        finally:
            d.stop()


def ctl(daemon, *args: str):
    from test_service import voice as voice_in

    return voice_in(daemon.tmp, "ctl", *args)


def current_conversation(daemon) -> str:
    import json

    return json.loads(ctl(daemon, "status", "--json").stdout)["conversation"]


@pytest.mark.slow
@pytest.mark.parametrize("words", ["new conversation", "okay start over please"])
def test_voice_ctl_say_new_conversation_reports_the_new_one_and_succeeds(gap_daemon, words):
    assert ctl(gap_daemon, "say", "what", "time", "is", "it").returncode == 0
    before = current_conversation(gap_daemon)
    out = ctl(gap_daemon, "say", *words.split())
    assert out.returncode == 0, out.stderr
    after = current_conversation(gap_daemon)
    assert after != before
    assert out.stdout.splitlines() == [f"started a new conversation: {after} ({before} ended)"] and out.stderr == ""
    store = EventStore(gap_daemon.db)
    try:
        assert ended(store, before).reason == "asked"
    finally:
        store.close()
    again = ctl(gap_daemon, "say", *words.split())  # nothing said in the new one: it stays, and that is no error
    assert again.returncode == 0 and again.stdout.splitlines() == [
        f"conversation: {after} (nothing said in it yet: it stays)"]


@pytest.mark.slow
def test_a_failed_ctl_say_prints_only_its_error_line(gap_daemon):
    gap_daemon.server.n_ctx = 10  # the model refuses every request: the turn ends in an error, nothing said
    try:
        out = ctl(gap_daemon, "say", "what", "time", "is", "it")
    finally:
        gap_daemon.server.n_ctx = None
    assert out.returncode == 1 and "ended in an error" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert out.stdout == ""  # no empty "assistant: " line before it


@pytest.mark.slow
def test_status_and_history_say_the_conversation_ended_once_the_idle_gap_passed(gap_daemon):
    import time

    assert ctl(gap_daemon, "say", "what", "time", "is", "it").returncode == 0
    talked = current_conversation(gap_daemon)
    deadline = time.monotonic() + 30
    while current_conversation(gap_daemon) == talked:  # no request comes: the gap alone must end it
        assert time.monotonic() < deadline, "the conversation still current 30 s after a 10 s idle gap"
        time.sleep(1.0)
    listed = ctl(gap_daemon, "history", "--list").stdout.splitlines()
    line = next(entry for entry in listed if entry.startswith(talked))
    assert "ended: idle" in line and "current" not in line
    store = EventStore(gap_daemon.db)
    try:
        end = ended(store, talked)
        assert end.reason == "idle" and 10.0 <= end.idle_s < 15.0
    finally:
        store.close()


# -- voice chat --------------------------------------------------------------


def chat(tmp_path, db, lines: str, replies: list[str]) -> "subprocess.CompletedProcess[str]":
    import os
    import subprocess
    import sys

    script = tmp_path / "replies.toml"
    script.write_text("".join(f'[[reply]]\nchunk_delay_ms = 1\ntext = "{r}"\n' for r in replies))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_RUNTIME_DIR": str(tmp_path / "run"),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state")}
    return subprocess.run([sys.executable, "-m", "voice", "chat", "--db", str(db), "--llm", f"scripted:{script}"],
                          input=lines, capture_output=True, text=True, timeout=60, env=env)


def test_voice_chat_does_not_continue_an_ended_conversation(tmp_path):
    db = tmp_path / "events.db"
    store = EventStore(db)
    talk(store, "c-old", "what time is it")
    store.record("c-old", ev.ConversationEnd(reason="asked", words="start over"))
    store.close()
    out = chat(tmp_path, db, "hello\n", ["Hi."])
    assert out.returncode == 0, out.stderr
    store = EventStore(db)
    try:
        assert [m["content"] for m in derive_messages(store, "c-old")] == ["what time is it"]
        (new,) = [c for c in store.conversations() if c != "c-old"]
        assert [m["content"] for m in derive_messages(store, new)] == ["hello", "Hi."]
    finally:
        store.close()


def test_typing_start_over_in_voice_chat_ends_the_conversation_without_asking_the_model(tmp_path):
    db = tmp_path / "events.db"
    out = chat(tmp_path, db, "hello\nokay start over please\nhi again\n", ["Hi.", "Hello again."])
    assert out.returncode == 0, out.stderr
    assert "Okay, starting fresh." in out.stdout
    store = EventStore(db)
    try:
        first, second = store.conversations()
        assert [m["content"] for m in derive_messages(store, first)] == ["hello", "Hi."]
        assert ended(store, first).reason == "asked" and ended(store, first).words == "okay start over please"
        assert [m["content"] for m in derive_messages(store, second)] == ["hi again", "Hello again."]
    finally:
        store.close()
