"""Typed event bodies: what a writer records is what a reader gets back,
rows written by earlier versions still read, and one meaning has one
wording whoever writes it."""

from __future__ import annotations

import dataclasses
import json

import anyio
import pytest

from conftest import run_and_cancel_when, scripted, text_agent
from voice.agent.recovery import close_open_turns
from voice.agent.tools.base import Tool, ToolRegistry
from voice.log import events as ev
from voice.log.store import EventStore

# One body of each type, as its writer makes it.
SAMPLES: list[ev.Body] = [
    ev.TurnStart(source="voice"),
    ev.UserMessage(content="what time is it", source="voice"),
    ev.UserStop(content="stop", source="voice", intent="stop", stopped_turn=3),
    ev.StepStart(route={"provider": "scripted", "model": "m", "base_url": None}),
    ev.StepEnd(outcome="tool_calls"),
    ev.AssistantStream.start({"provider": "scripted", "model": "m", "base_url": None}),
    ev.AssistantMessage(message_id="3.0.0", content=[{"type": "text", "text": "Hi."}], finish_reason="stop",
                        stream=[[0.0, "text", "Hi."], [1.5, "finish", "stop"]], tool_calls=[],
                        early={"words_ms": -412.5, "sent_ms": -410.0, "first_text_ms": -180.2}),
    ev.AssistantAttempt(message_id="3.0.1", reason="empty", content=[], stream=[]),
    ev.RequestError(message="HTTP 500", status=500, retryable=True),
    ev.ToolCalled(tool_call_id="call_3_0_0_0", name="add_note", arguments='{"text": "milk"}', provider_id="x"),
    ev.ToolDispatched(tool_call_id="call_3_0_0_0", name="add_note", effect="write", arguments={"text": "milk"}),
    ev.ToolResult.ok("call_3_0_0_0", "add_note", {"saved": True}, ev.CONFIRMED, "Done, I saved the note."),
    ev.EffectReceipt(tool_call_id="call_3_0_0_0", name="add_note", state=ev.CONFIRMED, evidence={"offset": 0}),
    ev.SpeechPlayed(message_id="3.0.0", chars=3, words=1, samples=4800, complete=True),
    ev.SpeechPaused(onset=16000),
    ev.SpeechResumed(onset=16000, reason="no speech followed"),
    ev.SpeechConfirmed(onset=16000, at=24000, reason="voiced speech"),
    ev.SpeechCleared(at=30000, onset=16000),
    ev.SpeechSentence(message_id="3.0.0", index=0, char_start=0, char_end=3, start=4800, length=4800, handed=2400,
                      method="alignment", words=[[0, 3, 0, 4800]], asked=102.25, ready=102.4, early=True),
    ev.AudioClock(mic=16000, speaker=48000, speaker_rate=48000, output_latency=960),
    ev.DeviceLost(reason="the output stream stopped calling back (336 ms)", speaker=96000, mic=64000),
    ev.DeviceBack(devices="mic 'default' @ 44100 Hz, speaker 'default' @ 44100 Hz", after_s=4.2, attempts=4),
    ev.SystemResumed(asleep_s=28800.4),
    ev.SpeechOwed(text="Done, your timer for one minute is set.", said="aloud", waited_s=4.2),
    ev.DevicePinned(pinned="mic 'USB Headset'", devices="mic 'default' @ 44100 Hz, speaker 'default' @ 44100 Hz",
                    present=False),
    ev.AudioMuted(silent_s=10.02, position=480000),
    ev.AudioUnmuted(muted_s=31.5, position=992000),
    ev.ListenSpeech(start=16000, end=30000, decided=40000, for_assistant=True),
    ev.ListenWake(position=17000, model="okay_nabu"),
    ev.ListenWindow(position=17500),
    ev.ListenControl(command="mute", position=18000),
    ev.LateOutput(kind="tts-audio", message_id="3.0.0", sentence=1, samples=2400),
    ev.ApprovalRequested(approval_id="call_4_0_0_0", tool="home__HassTurnOff", server="home", title="HassTurnOff",
                         arguments={"name": "Front door"}, question="Should I use HassTurnOff on home?"),
    ev.ApprovalAnswered(approval_id="call_4_0_0_0", decision="granted", how="voice", words="yes", always=False),
    ev.AcpSession(cwd="/home/me/project"),
    ev.ConversationFork(parent="c-a", turn=3),
    ev.ConversationEnd(reason="idle", idle_s=901.5),
    ev.ConversationSummary(text="The person asked about tides.", first_turn=1, last_turn=4,
                           route={"provider": "openai", "model": "m", "base_url": "http://x/v1"}),
    ev.TimerSet(timer_id="t-1", label="pasta", seconds=60, due_wall=1.5e9, tool_call_id="call_3_0_0_0"),
    ev.TimerCancel(timer_id="t-1"),
    ev.TimerFired(timer_id="t-1", late=False, at_wall=1.5e9, text="Your pasta timer is done."),
    ev.RuntimeRecovery(closed_turns=[3], unknown_writes=0, reconciled=0),
    ev.TurnEnd(outcome=ev.ABORTED, reason="stop"),
]


def test_every_type_has_one_body_and_a_sample():
    assert {type(b).TYPE for b in SAMPLES} == ev.EVENT_TYPES == set(ev.BODIES)
    assert len(SAMPLES) == len(ev.EVENT_TYPES)
    assert ev.SURFACE_TYPES == {ev.USER_MESSAGE, ev.ASSISTANT_MESSAGE, ev.TOOL_RESULT}
    # An approval is durable: a dispatch follows only a grant on disk, and a question survives a crash.
    assert ev.DURABLE_TYPES == {ev.TOOL_DISPATCH, ev.EFFECT_RECEIPT, ev.TIMER_SET, ev.TIMER_CANCEL, ev.TIMER_FIRED,
                                ev.TURN_END, ev.APPROVAL_REQUESTED, ev.APPROVAL_ANSWERED}


@pytest.mark.parametrize("body", SAMPLES, ids=lambda b: type(b).TYPE)
def test_a_recorded_body_reads_back_equal(tmp_path, body):
    with_store = EventStore(tmp_path / "events.db")
    try:
        written = with_store.record("c-a", body, turn=3, step=0, attempt=0)
        (row,) = with_store.events("c-a")
    finally:
        with_store.close()
    assert row.seq == written.seq and row.type == type(body).TYPE
    assert row.payload == body.payload() == written.payload
    assert row.body == body == ev.parse(row)


def test_rows_keep_the_keys_their_writers_gave():
    # Each kind of row keeps exactly the keys it always had: a finished
    # message has no "interrupted", a stopped one a null finish reason, text
    # released after a receipt no finish reason at all; a read's result a
    # null receipt, a call never run no receipt key.
    message = ev.AssistantMessage(message_id="1.0.0", content=[], route={}, finish_reason="stop", stream=[],
                                  tool_calls=[])
    assert set(message.payload()) == {"message_id", "content", "route", "finish_reason", "stream", "tool_calls"}
    stopped = ev.AssistantMessage(message_id="1.0.0", content=[], route={}, finish_reason=None, stream=[],
                                  interrupted=True, surfaceOp="append")
    assert stopped.payload()["finish_reason"] is None and stopped.payload()["interrupted"] is True
    released = ev.AssistantMessage(message_id="1.0.0.1", content=[], origin="tool", receipts=["confirmed"])
    assert set(released.payload()) == {"message_id", "content", "origin", "receipts"}
    assert released.finish_reason is None and released.interrupted is False  # read as absent
    assert ev.ToolResult.ok("c", "get_time", {}, None, None).payload() == {
        "tool_call_id": "c", "name": "get_time", "status": "ok", "content": {}, "receipt": None, "phrase": None}
    assert ev.ToolResult.not_dispatched("call_1", "add_note").payload() == {
        "tool_call_id": "call_1", "name": "add_note", "status": ev.ABORTED_BEFORE_DISPATCH,
        "error": "the turn was stopped before this call ran"}
    assert ev.AssistantStream.end_stopped().payload() == {"frame": "end", "aborted": True}
    assert ev.TurnEnd(outcome=ev.COMPLETED).payload() == {"outcome": ev.COMPLETED}
    # a plain field is always written
    assert ev.ToolCalled(tool_call_id="c", name="n").payload() == {
        "tool_call_id": "c", "name": "n", "arguments": "", "provider_id": None}


@pytest.mark.parametrize("payload", [
    {"frame": "end", "finish_reason": None},
    {"frame": "end", "aborted": True, "reason": "crashed"},
    {"frame": "start", "route": {"provider": "p"}},
])
def test_a_row_read_back_writes_the_same_keys(payload):
    row = ev.Event(1, "c-a", 1, 0, 0, ev.ASSISTANT_STREAM, payload, 0.0, 0.0)
    assert row.body.payload() == payload


def _older_row(store, type_: str, payload: dict) -> None:
    """A row as an older version wrote it, inserted as it stands (the
    untyped `EventStore.append` that wrote these is gone, #25: `record`
    writes every key of a body, so it cannot make such a row)."""
    store._db.execute("INSERT INTO events(conversation, turn, step, attempt, type, payload, at_mono, at_wall)"
                      " VALUES (?,?,?,?,?,?,?,?)", ("c-a", 1, None, None, type_, ev.encode_payload(payload), 0.0, 0.0))


def test_rows_of_earlier_versions_read(store):
    # Payloads as older versions (and tests) wrote them: keys missing.
    _older_row(store, ev.TOOL_CALL, {"tool_call_id": "call_x", "name": "add_note"})
    _older_row(store, ev.EFFECT_RECEIPT, {"tool_call_id": "call_x", "state": "confirmed"})
    _older_row(store, ev.STEP_START, {})
    _older_row(store, ev.ASSISTANT_MESSAGE, {"content": [{"type": "text", "text": "Hi"}], "extra": 1})
    call, receipt, step, message = (e.body for e in store.events("c-a"))
    assert call == ev.ToolCalled(tool_call_id="call_x", name="add_note", arguments="", provider_id=None)
    assert receipt.phase == "dispatch" and receipt.evidence == {}  # before reconciliation existed
    assert step.route is None
    assert message.text == "Hi" and message.message_id == "" and message.tool_calls is None


def test_a_row_without_a_required_key_is_named():
    row = ev.Event(7, "c-a", 1, None, None, ev.TURN_END, {"reason": "stop"}, 0.0, 0.0)
    with pytest.raises(ValueError, match="turn/end payload lacks outcome"):
        row.body


def test_only_bodies_are_recorded(store):
    @dataclasses.dataclass(frozen=True)
    class NotABody:
        TYPE = "turn/end"

        def payload(self):
            return {"outcome": "completed"}

    with pytest.raises(ValueError, match="not an event body"):
        store.record("c-a", NotABody())  # type: ignore[arg-type]
    assert store.events() == []


def test_payloads_stay_plain_json(store):
    with pytest.raises(ValueError, match="not JSON"):
        store.record("c-a", ev.UserMessage(content="x", source=object()))  # type: ignore[arg-type]
    assert store.events() == []
    row = store.record("c-a", ev.UserMessage(content="ünïcode"))
    assert json.loads(store._db.execute("SELECT payload FROM events").fetchone()[0]) == row.payload


# -- one meaning, one wording ----------------------------------------------------


@pytest.mark.anyio
async def test_a_call_never_run_reads_the_same_whoever_closes_it(tmp_path):
    """The loop closes the calls a stop left undispatched; recovery closes
    those a crash left: the model reads one wording for one meaning (they
    used to say "the turn was stopped" and "the assistant stopped")."""
    started = anyio.Event()

    async def slow_read(args, ctx):
        started.set()
        await anyio.sleep(10)

    tools = ToolRegistry([Tool("slow_read", "slow", {"type": "object"}, "read", slow_read, timeout_s=30),
                          Tool("other", "other", {"type": "object"}, "read", slow_read, timeout_s=30)])
    calls = [{"name": "slow_read", "arguments": {}}, {"name": "other", "arguments": {}}]
    stopped = EventStore(tmp_path / "stopped.db")
    crashed = EventStore(tmp_path / "crashed.db")
    try:
        agent, _ = text_agent(stopped, scripted({"chunk_delay_ms": 1, "tool_calls": calls}), tools=tools)
        await run_and_cancel_when(agent, "go", started.is_set)
        by_loop = [e.payload for e in stopped.events() if e.type == ev.TOOL_RESULT and e.payload["name"] == "other"]

        # the same calls, as a killed process left them: committed, none dispatched
        turn = crashed.start_turn("c-test", ev.TurnStart(source="text"))
        for n, call in enumerate(calls):
            crashed.record("c-test", ev.ToolCalled(tool_call_id=f"call_{turn}_0_0_{n}", name=call["name"]),
                           turn=turn, step=0, attempt=0)
        close_open_turns(crashed)
        by_recovery = [e.payload for e in crashed.events() if e.type == ev.TOOL_RESULT and e.payload["name"] == "other"]
    finally:
        stopped.close()
        crashed.close()
    assert [{**p, "tool_call_id": "x"} for p in by_loop] == [{**p, "tool_call_id": "x"} for p in by_recovery]
    assert by_loop[0]["status"] == ev.ABORTED_BEFORE_DISPATCH
