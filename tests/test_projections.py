"""Views derived from the log: chat view, trajectory, forks, and the
`speech/played` amendment that voice relies on."""

from __future__ import annotations

import pytest

from conftest import printed_reply, run_and_cancel_when, scripted, text_agent
from voice.log import events as ev
from voice.log.projections import chat_view, derive_messages, fork, trajectory, format_trajectory

pytestmark = pytest.mark.anyio

LONG = "One thing about bees. Another thing about honey. A last thing about flowers in spring."


def words_printed(out) -> int:
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("assistant: ")]
    return len(lines[-1].split()) - 1 if lines else 0


async def _cut_conversation(store):
    provider = scripted({"text": "Hello there.", "chunk_delay_ms": 1},
                        {"text": LONG, "chunk_delay_ms": 10},
                        {"text": "Fine.", "chunk_delay_ms": 1})
    agent, out = text_agent(store, provider)
    first = await agent.run_turn("hi")
    cut = await run_and_cancel_when(agent, "bees?", lambda: words_printed(out) >= 4)
    printed = printed_reply(out)
    last = await agent.run_turn("ok")
    return first.turn, cut.turn, last.turn, printed


async def test_chat_view_marks_the_stopped_reply(store):
    _, _, _, printed = await _cut_conversation(store)
    assert chat_view(store, "c-test") == [
        "you: hi", "assistant: Hello there.",
        "you: bees?", f"assistant: {printed} [stopped]",
        "you: ok", "assistant: Fine.",
    ]


async def test_trajectory_lists_each_request_with_its_fate(store):
    provider = scripted({"text": "Oops, broken.", "error_after_chars": 4, "chunk_delay_ms": 1},
                        {"text": "Now.", "chunk_delay_ms": 1, "tool_calls": [{"name": "get_time", "arguments": {}}]},
                        {"text": "It is late.", "chunk_delay_ms": 1})
    agent, _ = text_agent(store, provider, retries=1)
    result = await agent.run_turn("time?")
    records, outcome = trajectory(store, "c-test", result.turn)
    assert outcome == ev.COMPLETED
    assert [(r.step, r.attempt, r.outcome) for r in records] == [(0, 0, "error"), (0, 1, "result"), (1, 0, "result")]
    assert records[0].error and "scripted stream error" in records[0].error
    assert records[1].tool_calls == ["get_time"]
    assert any("tool get_time: ok" in step for step in records[1].lifecycle)
    assert all(r.provider == "scripted" for r in records)
    seqs = {e.seq for e in store.events("c-test", turn=result.turn)}
    assert records[1].result_seq in seqs and records[2].result_seq in seqs
    text = format_trajectory(result.turn, records, outcome)
    assert f"turn {result.turn}: completed" in text and "error:" in text


async def test_fork_at_the_cut_turn_inherits_the_delivered_prefix(store):
    _, cut, _, printed = await _cut_conversation(store)
    new = fork(store, "c-test", cut)
    assert new != "c-test"
    forked = derive_messages(store, new)
    assert forked == derive_messages(store, "c-test", upto=cut)
    assert forked[-1] == {"role": "assistant", "content": printed, "interrupted": True}
    assert all(m["content"] != "ok" for m in forked)  # later turns stay behind


async def test_a_forked_conversation_continues_from_the_prefix(store):
    _, cut, _, printed = await _cut_conversation(store)
    new = fork(store, "c-test", cut)
    provider = scripted({"text": "Continuing.", "chunk_delay_ms": 1})
    agent, _ = text_agent(store, provider, conversation=new)
    await agent.run_turn("go on")
    assert list(provider.requests[0].messages)[-2:] == [
        {"role": "assistant", "content": printed}, {"role": "user", "content": "go on"}]


def test_speech_played_amends_a_completed_message(store):
    """Voice: the stream completed, then the person cut the speech. The
    amendment (not a rewrite) makes history hold only what was heard."""
    turn = store.start_turn("c1", ev.TurnStart(source="voice"))
    # (rows recorded as bodies: the untyped `append` these used is gone, #25)
    store.record("c1", ev.UserMessage(content="tell me"), turn=turn)
    store.record("c1", ev.AssistantMessage(message_id=f"{turn}.0.0", content=[
        {"type": "text", "text": "Alpha beta gamma. Delta epsilon."}]), turn=turn, step=0, attempt=0)
    store.record("c1", ev.SpeechPlayed(message_id=f"{turn}.0.0", chars=16, words=3, samples=30000, complete=False),
                 turn=turn, step=0, attempt=0)
    store.end_turn("c1", turn, ev.ABORTED)
    assert derive_messages(store, "c1")[-1] == {"role": "assistant", "content": "Alpha beta gamma", "interrupted": True}
    assert chat_view(store, "c1")[-1] == "assistant: Alpha beta gamma [stopped]"
    new = fork(store, "c1", turn)
    assert derive_messages(store, new) == derive_messages(store, "c1")


def test_speech_played_with_nothing_heard_drops_the_message(store):
    turn = store.start_turn("c1", ev.TurnStart(source="voice"))
    store.record("c1", ev.UserMessage(content="tell me"), turn=turn)
    store.record("c1", ev.AssistantMessage(message_id=f"{turn}.0.0", content=[
        {"type": "text", "text": "Alpha beta."}]), turn=turn, step=0, attempt=0)
    store.record("c1", ev.SpeechPlayed(message_id=f"{turn}.0.0", chars=0, words=0, samples=0, complete=False),
                 turn=turn, step=0, attempt=0)
    assert derive_messages(store, "c1") == [{"role": "user", "content": "tell me"}]
