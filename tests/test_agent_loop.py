"""The agent loop's cancellation semantics on the text surface (docs/ARCHITECTURE.md: the cancellation protocol, I1-I6):
what is recorded when the person stops a turn in each phase."""

from __future__ import annotations

import anyio
import pytest

from conftest import printed_reply, run_and_cancel_when, scripted, text_agent
from voice.agent.tools.base import Tool, ToolRegistry
from voice.agent.tools.clock import get_time_tool
from voice.log import events as ev
from voice.log.projections import derive_messages, message_text

pytestmark = pytest.mark.anyio

LONG = "First point is about the tide. Second point is about salt. Third point is about whales and their songs."


def words_printed(out) -> int:
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("assistant: ")]
    return len(lines[-1].split()) - 1 if lines else 0


def of_turn(store, turn, *types):
    return [e for e in store.events("c-test", turn=turn) if not types or e.type in types]


async def test_interrupted_content_is_exactly_what_was_printed(store):
    agent, out = text_agent(store, scripted({"text": LONG, "chunk_delay_ms": 15}))
    result = await run_and_cancel_when(agent, "tell me", lambda: words_printed(out) >= 5)
    assert result.outcome == ev.ABORTED
    printed = printed_reply(out)
    assert out.getvalue().rstrip().endswith("[stopped]")
    (msg,) = of_turn(store, result.turn, ev.ASSISTANT_MESSAGE)
    assert msg.payload["interrupted"] is True
    assert msg.payload["surfaceOp"] == "append"
    assert message_text(msg.payload) == printed
    assert LONG.startswith(printed) and printed != LONG
    assert len(printed.split()) >= 5


async def test_embedded_timed_stream_is_kept(store):
    agent, out = text_agent(store, scripted({"text": LONG, "reasoning": "think first", "chunk_delay_ms": 10}))
    result = await run_and_cancel_when(agent, "tell me", lambda: words_printed(out) >= 3)
    (msg,) = of_turn(store, result.turn, ev.ASSISTANT_MESSAGE)
    stream = msg.payload["stream"]
    kinds = [k for _, k, _ in stream]
    assert kinds[:2] == ["reasoning", "reasoning"] and "text" in kinds
    assert "".join(d for _, k, d in stream if k == "reasoning") == "think first"
    assert "".join(d for _, k, d in stream if k == "text") == printed_reply(out)
    offsets = [t for t, _, _ in stream]
    assert offsets == sorted(offsets) and offsets[-1] > 0
    assert msg.payload["route"]["provider"] == "scripted"


async def test_completed_message_keeps_stream_with_finish(store):
    agent, _ = text_agent(store, scripted({"text": "Short answer.", "chunk_delay_ms": 1}))
    result = await agent.run_turn("hi")
    assert result.outcome == ev.COMPLETED
    (msg,) = of_turn(store, result.turn, ev.ASSISTANT_MESSAGE)
    assert "interrupted" not in msg.payload
    assert msg.payload["stream"][-1][1:] == ["finish", "stop"]
    assert message_text(msg.payload) == "Short answer."


async def test_event_order_on_cancel(store):
    agent, out = text_agent(store, scripted({"text": LONG, "chunk_delay_ms": 10}))
    result = await run_and_cancel_when(agent, "tell me", lambda: words_printed(out) >= 2)
    types = [e.type for e in of_turn(store, result.turn)]
    stream_end = [i for i, e in enumerate(of_turn(store, result.turn))
                  if e.type == ev.ASSISTANT_STREAM and e.payload["frame"] == "end"]
    assert types[0] == ev.TURN_START and types[1] == ev.USER_MESSAGE
    i_msg = types.index(ev.ASSISTANT_MESSAGE)
    assert i_msg < stream_end[0] < types.index(ev.STEP_END) < types.index(ev.TURN_END) == len(types) - 1
    assert types.count(ev.TURN_END) == 1
    assert of_turn(store, result.turn, ev.TURN_END)[0].payload["outcome"] == ev.ABORTED


async def test_next_request_contains_the_delivered_prefix(store):
    provider = scripted({"text": LONG, "chunk_delay_ms": 10}, {"text": "You stopped me.", "chunk_delay_ms": 1})
    agent, out = text_agent(store, provider, system_prompt="be brief")
    await run_and_cancel_when(agent, "tell me", lambda: words_printed(out) >= 4)
    printed = printed_reply(out)
    await agent.run_turn("what did you say?")
    sent = list(provider.requests[1].messages)
    assert sent == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "tell me"},
        {"role": "assistant", "content": printed},
        {"role": "user", "content": "what did you say?"},
    ]
    history = derive_messages(store, "c-test")
    assert history[1] == {"role": "assistant", "content": printed, "interrupted": True}


async def test_reasoning_only_output_shown_but_not_model_history(store):
    agent, out = text_agent(store, scripted({"reasoning": "Let me think about the tides and the moon.",
                                             "text": LONG, "chunk_delay_ms": 10}))
    result = await run_and_cancel_when(agent, "tell me", lambda: "moon" in out.getvalue())
    (msg,) = of_turn(store, result.turn, ev.ASSISTANT_MESSAGE)
    assert msg.payload["interrupted"] is True
    assert [b["type"] for b in msg.payload["content"]] == ["reasoning"]
    assert msg.payload["content"][0]["text"] == "Let me think about the tides and the moon."
    assert [m["role"] for m in derive_messages(store, "c-test")] == ["user"]


async def test_reasoning_not_shown_is_not_delivered(store):
    """A surface that does not show reasoning (like speech) delivered nothing."""
    agent, out = text_agent(store, scripted({"reasoning": "Let me think about the tides.", "text": LONG,
                                             "chunk_delay_ms": 10}), show_reasoning=False)
    provider_started = lambda: len(agent.provider.requests) == 1  # noqa: E731
    await anyio.sleep(0)
    result = await run_and_cancel_when(agent, "tell me", provider_started)
    assert not of_turn(store, result.turn, ev.ASSISTANT_MESSAGE)
    (attempt,) = of_turn(store, result.turn, ev.ASSISTANT_ATTEMPT)
    assert attempt.payload["reason"] == "aborted"


async def test_tool_calls_are_omitted_from_interrupted_content(store):
    provider = scripted({"text": "Let me check the time.", "chunk_delay_ms": 20,
                         "tool_calls": [{"name": "get_time", "arguments": {}}]})
    agent, out = text_agent(store, provider)
    # Cancel once the tool-call deltas have begun (the whole text is printed).
    result = await run_and_cancel_when(
        agent, "time?", lambda: any(k == "tool_call" for _, k, _ in _live_stream(agent)))
    (msg,) = of_turn(store, result.turn, ev.ASSISTANT_MESSAGE)
    assert msg.payload["interrupted"] is True
    assert "tool_calls" not in msg.payload
    assert [b["type"] for b in msg.payload["content"]] == ["text"]
    assert any(k == "tool_call" for _, k, _ in msg.payload["stream"])  # kept for the record
    assert not of_turn(store, result.turn, ev.TOOL_CALL, ev.TOOL_DISPATCH, ev.TOOL_RESULT)
    assert derive_messages(store, "c-test")[-1] == {"role": "assistant", "content": "Let me check the time.",
                                                    "interrupted": True}


def _live_stream(agent):
    """The timed stream of the request in flight (empty when none)."""
    frame = agent.in_flight()
    return frame.timed_stream if frame else []


async def test_cancel_during_retry_after_provider_error(store):
    provider = scripted(
        {"text": "Broken reply that will fail midway through.", "error_after_chars": 12, "chunk_delay_ms": 5},
        {"text": LONG, "chunk_delay_ms": 15},
    )
    agent, out = text_agent(store, provider, retries=1)
    result = await run_and_cancel_when(agent, "tell me", lambda: "First point" in out.getvalue()
                                       and words_printed(out) >= 3)
    assert result.outcome == ev.ABORTED
    events = of_turn(store, result.turn)
    types = [e.type for e in events]
    attempt0 = [e for e in events if e.attempt == 0 and e.type in (ev.ASSISTANT_ATTEMPT, ev.REQUEST_ERROR)]
    assert [e.type for e in attempt0] == [ev.ASSISTANT_ATTEMPT, ev.REQUEST_ERROR]
    assert attempt0[0].payload["reason"] == "error"
    (msg,) = [e for e in events if e.type == ev.ASSISTANT_MESSAGE]
    assert msg.attempt == 1 and msg.payload["interrupted"] is True
    history = derive_messages(store, "c-test")
    assert history == [{"role": "user", "content": "tell me"},
                       {"role": "assistant", "content": printed_reply(out), "interrupted": True}]
    assert "Broken" not in str(history)
    assert types[-1] == ev.TURN_END


async def test_cancel_during_retry_backoff_leaves_no_content(store):
    provider = scripted({"text": "Broken reply here.", "error_after_chars": 7, "chunk_delay_ms": 5},
                        {"text": LONG, "chunk_delay_ms": 5})
    agent, out = text_agent(store, provider, retries=1, retry_backoff_s=5.0)
    result = await run_and_cancel_when(
        agent, "tell me", lambda: any(e.type == ev.REQUEST_ERROR for e in store.events("c-test")))
    assert result.outcome == ev.ABORTED
    assert len(provider.requests) == 1  # the retry never started
    assert not of_turn(store, result.turn, ev.ASSISTANT_MESSAGE)
    assert [m["role"] for m in derive_messages(store, "c-test")] == ["user"]
    (end,) = of_turn(store, result.turn, ev.STEP_END)
    assert end.payload["outcome"] == ev.ABORTED


async def test_provider_error_without_retry_keeps_attempt_before_error(store):
    provider = scripted({"text": "Partial text then failure.", "error_after_chars": 8, "chunk_delay_ms": 1})
    agent, out = text_agent(store, provider, retries=0)
    result = await agent.run_turn("hi")
    assert result.outcome == ev.ERROR
    types = [e.type for e in of_turn(store, result.turn)]
    assert types.index(ev.ASSISTANT_ATTEMPT) < types.index(ev.REQUEST_ERROR) < types.index(ev.TURN_END)
    assert [m["role"] for m in derive_messages(store, "c-test")] == ["user"]
    assert "[error]" in out.getvalue()


async def test_empty_prefix_is_an_attempt_not_a_message(store):
    agent, out = text_agent(store, scripted({"text": LONG, "first_delay_ms": 2000}))
    result = await run_and_cancel_when(agent, "tell me", lambda: len(agent.provider.requests) == 1)
    assert result.outcome == ev.ABORTED
    assert not of_turn(store, result.turn, ev.ASSISTANT_MESSAGE)
    (attempt,) = of_turn(store, result.turn, ev.ASSISTANT_ATTEMPT)
    assert attempt.payload["reason"] == "aborted" and attempt.payload["content"] == []
    assert derive_messages(store, "c-test") == [{"role": "user", "content": "tell me"}]


async def test_cancel_during_tool_execution(store):
    started = anyio.Event()

    async def slow(args, ctx):
        started.set()
        await anyio.sleep(30)
        return "never"

    tools = ToolRegistry([Tool("slow_lookup", "waits", {"type": "object"}, "read", slow, timeout_s=60),
                          get_time_tool()])
    provider = scripted({"text": "Checking.", "chunk_delay_ms": 1, "tool_calls": [
        {"name": "slow_lookup", "arguments": {}}, {"name": "get_time", "arguments": {}}]})
    agent, out = text_agent(store, provider, tools=tools)
    with anyio.fail_after(5):
        result = await run_and_cancel_when(agent, "look it up", started.is_set)
    assert result.outcome == ev.ABORTED
    results = {e.payload["name"]: e.payload for e in of_turn(store, result.turn, ev.TOOL_RESULT)}
    assert results["slow_lookup"]["status"] == "cancelled"
    assert results["get_time"]["status"] == ev.ABORTED_BEFORE_DISPATCH
    dispatched = [e.payload["name"] for e in of_turn(store, result.turn, ev.TOOL_DISPATCH)]
    assert dispatched == ["slow_lookup"]
    history = derive_messages(store, "c-test")
    call_ids = {c["id"] for c in history[1]["tool_calls"]}
    assert call_ids == {m["tool_call_id"] for m in history if m["role"] == "tool"}
    assert history[1]["content"] == "Checking."


async def test_bad_tool_arguments_become_an_error_result(store):
    provider = scripted({"tool_calls": [{"name": "no_such_tool", "arguments": {}}], "chunk_delay_ms": 1},
                        {"text": "Sorry.", "chunk_delay_ms": 1})
    agent, _ = text_agent(store, provider)
    result = await agent.run_turn("do it")
    assert result.outcome == ev.COMPLETED
    (res,) = of_turn(store, result.turn, ev.TOOL_RESULT)
    assert res.payload["status"] == "error" and "no_such_tool" in res.payload["error"]


async def test_wait_idle_returns_once_the_stopped_turn_is_recorded(store):
    # What a shutdown needs: cancel the turn, then wait (not poll) until its
    # stop is in the log.
    agent, out = text_agent(store, scripted({"text": LONG, "chunk_delay_ms": 20}))
    with anyio.fail_after(1):
        await agent.wait_idle()  # no turn: at once
    async with anyio.create_task_group() as tg:
        tg.start_soon(agent.run_turn, "tell me")
        with anyio.fail_after(5):
            while words_printed(out) < 2:
                await anyio.sleep(0.005)
        assert agent.busy and agent.cancel(ev.INTERRUPTED)
        with anyio.fail_after(5):
            await agent.wait_idle()
        assert not agent.busy
        (end,) = [e for e in store.events("c-test") if e.type == ev.TURN_END]
        assert end.payload["outcome"] == ev.INTERRUPTED
