"""`voice acp`: an ACP round trip driven by the SDK's client side against the
agent in a subprocess (scripted LLM, real log): a completed prompt, a tool
call reported as tool_call + tool_call_update, and a cancel mid-reply whose
delivered prefix is exactly the chunk text the client received."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import acp
from acp import spawn_agent_process, text_block
from acp.connection import StreamDirection, StreamEvent

from voice.log import events as ev
from voice.log.projections import derive_messages, message_text
from voice.log.store import EventStore

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[1]
AGENT = ["-m", "voice", "acp"]
BOUND_S = 30.0

LONG = ("One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four "
        "twenty-five twenty-six twenty-seven twenty-eight twenty-nine thirty.")


class _Client:
    """The client side: updates are read from the raw stream (in order)."""

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        return None

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise acp.RequestError.method_not_found("session/request_permission")


class Wire:
    """Every message the agent sent, in arrival order."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def observe(self, event: StreamEvent) -> None:
        if event.direction == StreamDirection.INCOMING:
            self.messages.append(event.message)

    def updates(self, kind: str, start: int = 0, end: int | None = None) -> list[dict[str, Any]]:
        return [m["params"]["update"] for m in self.messages[start:end]
                if m.get("method") == "session/update" and m["params"]["update"]["sessionUpdate"] == kind]

    def chunks(self, start: int = 0, end: int | None = None) -> list[str]:
        return [u["content"]["text"] for u in self.updates("agent_message_chunk", start, end)]

    def response_index(self, start: int = 0) -> int:
        """Index of the first prompt response (a result with a stopReason) from `start`."""
        for i, m in enumerate(self.messages[start:], start):
            if "id" in m and "method" not in m and isinstance(m.get("result"), dict) and "stopReason" in m["result"]:
                return i
        raise AssertionError("no prompt response received")


@asynccontextmanager
async def agent(tmp_path: Path, script: str, client: Any = None) -> AsyncIterator[tuple[Any, Wire, Path]]:
    llm = tmp_path / "llm.toml"
    llm.write_text(script, encoding="utf-8")
    db = tmp_path / "events.db"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    for var in ("XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME"):
        env[var] = str(tmp_path / var.lower())
    env.pop("VOICE_DB", None)
    wire = Wire()
    with open(tmp_path / "agent.stderr", "wb") as err:
        async with spawn_agent_process(
            client or _Client(), sys.executable, *AGENT, "--db", str(db), "--llm", f"scripted:{llm}",
            env=env, cwd=REPO, transport_kwargs={"stderr": err}, observers=[wire.observe],
        ) as (conn, proc):
            with anyio.fail_after(BOUND_S):
                init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            assert init.protocol_version == acp.PROTOCOL_VERSION
            yield conn, wire, db
        # Leaving closes the agent's stdin: it must exit by itself, cleanly.
        with anyio.fail_after(5):
            code = await proc.wait()
    assert code == 0, (tmp_path / "agent.stderr").read_text()


async def new_session(conn: Any, tmp_path: Path) -> str:
    with anyio.fail_after(BOUND_S):
        return (await conn.new_session(cwd=str(tmp_path))).session_id


async def prompt(conn: Any, session: str, text: str) -> str:
    with anyio.fail_after(BOUND_S):
        return (await conn.prompt(session_id=session, prompt=[text_block(text)])).stop_reason


def history(db: Path, conversation: str) -> list[dict[str, Any]]:
    store = EventStore(db)
    try:
        return derive_messages(store, conversation)
    finally:
        store.close()


async def test_prompt_streams_chunks_and_ends_turn(tmp_path):
    reply = "Hello there, this is a scripted reply."
    async with agent(tmp_path, f'[[reply]]\nchunk_delay_ms = 5\ntext = "{reply}"\n') as (conn, wire, db):
        session = await new_session(conn, tmp_path)
        assert await prompt(conn, session, "hi") == "end_turn"
        assert "".join(wire.chunks()) == reply
        assert len(wire.chunks()) > 1
        assert wire.response_index() > max(i for i, m in enumerate(wire.messages) if m.get("method") == "session/update")
    assert history(db, session) == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply}]


async def test_tool_call_is_reported(tmp_path):
    script = ('[[reply]]\nchunk_delay_ms = 5\n[[reply.tool_calls]]\nname = "get_time"\narguments = {}\n'
              '[[reply]]\nchunk_delay_ms = 5\ntext = "It is time."\n')
    async with agent(tmp_path, script) as (conn, wire, db):
        session = await new_session(conn, tmp_path)
        assert await prompt(conn, session, "what time is it?") == "end_turn"
        kinds = [m["params"]["update"]["sessionUpdate"] for m in wire.messages if m.get("method") == "session/update"]
        assert kinds[:3] == ["tool_call", "tool_call_update", "tool_call_update"], kinds
        start, = wire.updates("tool_call")
        running, done = wire.updates("tool_call_update")
        # Pending when the model made it, in progress once dispatched, then its final status; a readable title.
        assert start["title"] == "Get time" and start["status"] == "pending"
        assert running["toolCallId"] == start["toolCallId"] and running["status"] == "in_progress"
        assert done["toolCallId"] == start["toolCallId"] and done["status"] == "completed"
        assert "iso" in done["rawOutput"]
        assert "".join(wire.chunks()) == "It is time."
    messages = history(db, session)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["tool_calls"][0]["function"]["name"] == "get_time"
    assert messages[2]["tool_call_id"] == start["toolCallId"]


async def test_cancel_mid_reply_records_exactly_the_chunks_sent(tmp_path):
    script = (f'[[reply]]\nchunk_delay_ms = 80\ntext = "{LONG}"\n'
              '[[reply]]\nchunk_delay_ms = 5\ntext = "Where was I."\n')
    async with agent(tmp_path, script) as (conn, wire, db):
        session = await new_session(conn, tmp_path)
        async with anyio.create_task_group() as tg:
            result: list[str] = []

            async def run() -> None:
                result.append(await prompt(conn, session, "count to thirty"))

            tg.start_soon(run)
            with anyio.fail_after(BOUND_S):
                while len(wire.chunks()) < 5:
                    assert not result, "the reply ended before the cancel point"
                    await anyio.sleep(0.005)
            await conn.cancel(session_id=session)
        assert result == ["cancelled"]
        end = wire.response_index()
        received = "".join(wire.chunks(0, end))
        await anyio.sleep(0.3)  # nothing of the cancelled turn may follow its response
        assert wire.chunks(end) == []
        assert 5 <= len(wire.chunks(0, end)) < len(LONG.split())
        assert LONG.startswith(received) and received != LONG

        store = EventStore(db)
        try:
            kept = [e for e in store.events(session, types={ev.ASSISTANT_MESSAGE})]
            assert len(kept) == 1 and kept[0].payload.get("interrupted") is True
            assert message_text(kept[0].payload) == received
            ends = [e.payload for e in store.events(session, types={ev.TURN_END})]
            assert [p.get("outcome") for p in ends] == [ev.ABORTED]
        finally:
            store.close()

        assert await prompt(conn, session, "go on") == "end_turn"
        assert "".join(wire.chunks(end)) == "Where was I."
    assert history(db, session) == [
        {"role": "user", "content": "count to thirty"},
        {"role": "assistant", "content": received, "interrupted": True},
        {"role": "user", "content": "go on"},
        {"role": "assistant", "content": "Where was I."},
    ]


async def test_a_restarted_agent_tells_a_loaded_thread_again_with_only_what_was_heard(tmp_path):
    # session/load (voice/service/acp_history.py) after the agent process is gone: the person's words, the
    # reply's delivered prefix ending in a " [stopped]" chunk marked interrupted, each tool call once with its
    # final status, in the log's order; nothing of the undelivered rest of a stopped reply.
    script = ('[[reply]]\nchunk_delay_ms = 5\n[[reply.tool_calls]]\nname = "get_time"\narguments = {}\n'
              '[[reply]]\nchunk_delay_ms = 5\ntext = "It is time."\n'
              f'[[reply]]\nchunk_delay_ms = 80\ntext = "{LONG}"\n')
    async with agent(tmp_path, script) as (conn, wire, db):
        session = await new_session(conn, tmp_path)
        assert await prompt(conn, session, "what time is it?") == "end_turn"
        tool_call_id = wire.updates("tool_call")[0]["toolCallId"]
        first = len(wire.messages)
        async with anyio.create_task_group() as tg:
            tg.start_soon(prompt, conn, session, "count to thirty")
            with anyio.fail_after(BOUND_S):
                while len(wire.chunks(first)) < 4:
                    await anyio.sleep(0.005)
            await conn.cancel(session_id=session)
        received = "".join(wire.chunks(first, wire.response_index(first)))
    assert LONG.startswith(received) and received != LONG

    async with agent(tmp_path, '[[reply]]\ntext = "unused"\n') as (conn, wire, db):
        with anyio.fail_after(BOUND_S):
            await conn.load_session(cwd=str(tmp_path), session_id=session)
        told = [m["params"]["update"] for m in wire.messages if m.get("method") == "session/update"]
    said = [(u["sessionUpdate"], u["content"]["text"]) for u in told if "content" in u and "text" in u["content"]]
    assert said == [("user_message_chunk", "what time is it?"), ("agent_message_chunk", "It is time."),
                    ("user_message_chunk", "count to thirty"), ("agent_message_chunk", received),
                    ("agent_message_chunk", " [stopped]")]
    stopped = told[-1]
    assert stopped["_meta"] == {"voice": {"interrupted": True}}
    calls = [u for u in told if u["sessionUpdate"] == "tool_call"]
    assert [(c["toolCallId"], c["title"], c["status"]) for c in calls] == [(tool_call_id, "Get time", "completed")]
    assert "iso" in calls[0]["rawOutput"]
    # the call is told between the question and the words that followed it
    kinds = [u["sessionUpdate"] for u in told]
    assert kinds.index("tool_call") == 1


class _CancellingClient(_Client):
    """Answers every permission request `cancelled`, as a client does after
    its session/cancel: here the answer is all the agent gets (the order in
    which a notification and a response are handled is the agent's SDK's)."""

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        return acp.RequestPermissionResponse(outcome=acp.schema.DeniedOutcome(outcome="cancelled"))


async def test_a_permission_answered_cancelled_ends_the_turn_and_the_model_is_not_asked_again(tmp_path):
    # ACP: "cancelled" means the prompt turn was cancelled. Seen under a full suite's load: the response was handled
    # before the session/cancel that preceded it on the wire, the agent took it for "declined", asked the model again
    # (which used up the next scripted reply, a tool call) and answered end_turn to the next prompt.
    from mcp_fixtures import chaos_server_command

    journal = tmp_path / "chaos.journal"
    argv = chaos_server_command(journal)
    script = ('[[reply]]\nchunk_delay_ms = 5\n[[reply.tool_calls]]\nname = "chaos__unlock_door"\n'
              'arguments = {door = "front"}\n'
              '[[reply]]\nchunk_delay_ms = 5\ntext = "The model was asked again."\n')
    async with agent(tmp_path, script, _CancellingClient()) as (conn, wire, db):
        with anyio.fail_after(BOUND_S):
            session = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[acp.schema.McpServerStdio(
                name="chaos", command=argv[0], args=argv[1:], env=[])])).session_id
        assert await prompt(conn, session, "unlock the front door") == "cancelled"
        assert "".join(wire.chunks()) == ""
    store = EventStore(db)
    try:
        answers = [(e.body.decision, e.body.how) for e in store.events(session, types={ev.APPROVAL_ANSWERED})]
        steps = [e for e in store.events(session, types={ev.STEP_START})]
    finally:
        store.close()
    assert answers == [("withdrawn", "stopped")]
    assert len(steps) == 1  # the model was not asked again
