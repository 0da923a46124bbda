"""The skills provider: grammar -> tool calls and text, tool results read
back, the streaming contract, and one turn through the real agent loop."""

from __future__ import annotations

import re

import io
import json
import time
from dataclasses import replace
from typing import Any

import pytest

from voice.agent.providers.base import Finish, ModelRequest, ProviderRoute, TextDelta, ToolCallDelta
from voice.agent.providers.scripted import split_words
from voice.agent.providers.skills import HINT, SkillsProvider
from voice.agent.timer_service import spoken_duration
from voice.log import events as ev
from voice.log.events import ToolResult
from voice.log.projections import chat_view
from voice.log.window import tool_result_text

from conftest import printed_reply, text_agent
from voice.agent.loop import AgentLoop
from voice.agent.loop_settings import LoopSettings, ToolEnv
from voice.agent.tools.base import ToolRegistry
from voice.agent.tools.clock import get_time_tool
from voice.agent.tools.notes import notes_tools
from voice.surfaces.text import TextSurface

ALL_TOOLS = ["get_time", "set_timer", "cancel_timer", "list_timers", "add_note", "read_notes", "run_command"]


def schemas(*names: str) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, "description": "", "parameters": {}}} for n in names]


async def collect(messages: list[dict[str, Any]], results: dict[str, ToolResult] | None = None,
                  tools: list[str] = ALL_TOOLS, provider: SkillsProvider | None = None):
    provider = provider or SkillsProvider(chunk_delay_s=0)
    request = ModelRequest(messages=messages, tools=schemas(*tools), tool_results=results or {})
    return [d async for d in provider.stream(request)]


def calls_of(deltas) -> list[tuple[str, dict[str, Any]]]:
    return [(d.name, json.loads(d.arguments)) for d in deltas if isinstance(d, ToolCallDelta)]


def text_of(deltas) -> str:
    return "".join(d.text for d in deltas if isinstance(d, TextDelta))


async def ask(text: str, tools: list[str] = ALL_TOOLS):
    return await collect([{"role": "user", "content": text}], tools=tools)


# -- the grammar ---------------------------------------------------------------

GRAMMAR = [
    ("what time is it", "get_time", {}, ""),
    ("What's the time?", "get_time", {}, ""),
    ("Time.", "get_time", {}, ""),
    ("Set a timer for 10 minutes.", "set_timer", {"seconds": 600}, "Done, your timer for ten minutes is set."),
    ("set a timer for 45 seconds", "set_timer", {"seconds": 45}, "Done, your timer for forty-five seconds is set."),
    ("set a timer for 2 hours", "set_timer", {"seconds": 7200}, "Done, your timer for two hours is set."),
    ("Set a timer called pasta for 8 minutes", "set_timer", {"seconds": 480, "label": "pasta"},
     "Done, your timer for eight minutes is set."),
    ("set a timer named tea for three minutes", "set_timer", {"seconds": 180, "label": "tea"},
     "Done, your timer for three minutes is set."),
    ("set a timer for eggs for 7 minutes", "set_timer", {"seconds": 420, "label": "eggs"},
     "Done, your timer for seven minutes is set."),
    ("set a pizza timer for 12 minutes", "set_timer", {"seconds": 720, "label": "pizza"},
     "Done, your timer for twelve minutes is set."),
    ("please set a 5 minute timer", "set_timer", {"seconds": 300}, "Done, your timer for five minutes is set."),
    ("set a timer for 1 hour and 30 minutes", "set_timer", {"seconds": 5400},
     "Done, your timer for one hour and thirty minutes is set."),
    ("cancel the timer", "cancel_timer", {}, "Done, the timer is cancelled."),
    ("Stop the timer!", "cancel_timer", {}, "Done, the timer is cancelled."),
    ("cancel my pasta timer", "cancel_timer", {"label": "pasta"}, "Done, the timer is cancelled."),
    ("list timers", "list_timers", {}, ""),
    ("What timers do I have?", "list_timers", {}, ""),
    ("Add a note: Buy Oat Milk.", "add_note", {"text": "Buy Oat Milk"}, "Done, I saved the note."),
    ("note Call Anna back", "add_note", {"text": "Call Anna back"}, "Done, I saved the note."),
    ("take a note The code is 4711", "add_note", {"text": "The code is 4711"}, "Done, I saved the note."),
    ("Remember the car is on level 3", "add_note", {"text": "the car is on level 3"}, "Done, I saved the note."),
    ("read my notes", "read_notes", {}, ""),
    ("what are my notes", "read_notes", {}, ""),
    ("run backup", "run_command", {"name": "backup"}, "Done, backup ran."),
    ("Start Nightly Backup", "run_command", {"name": "nightly_backup"}, "Done, nightly backup ran."),
]


@pytest.mark.anyio
@pytest.mark.parametrize("utterance,name,args,after", GRAMMAR)
async def test_utterance_becomes_tool_call(utterance, name, args, after):
    deltas = await ask(utterance)
    assert calls_of(deltas) == [(name, args)]
    assert text_of(deltas) == after
    # a write's confirmation comes after its call, never before
    kinds = [type(d) for d in deltas]
    assert kinds[0] is ToolCallDelta
    assert deltas[-1] == Finish("tool_calls")


NUMBERS = [
    ("set a timer for ten seconds", 10),
    ("set a timer for twenty five minutes", 1500),
    ("set a timer for twenty-five minutes", 1500),
    ("set a timer for a minute", 60),
    ("set a timer for an hour", 3600),
    ("set a timer for half a minute", 30),
    ("set a timer for half an hour", 1800),
    ("set a timer for a minute and a half", 90),
    ("set a timer for one and a half hours", 5400),
    ("set a timer for ninety seconds", 90),
    ("set a timer for a hundred and twenty seconds", 120),
    ("set a timer for 1.5 minutes", 90),
    ("can you set a timer for a couple of minutes please", 120),
]


@pytest.mark.anyio
@pytest.mark.parametrize("utterance,seconds", NUMBERS)
async def test_number_words(utterance, seconds):
    deltas = await ask(utterance)
    assert calls_of(deltas) == [("set_timer", {"seconds": seconds})]
    assert text_of(deltas) == f"Done, your timer for {spoken_duration(seconds)} is set."


@pytest.mark.parametrize(
    "seconds,spoken",
    [(10, "ten seconds"), (1, "one second"), (60, "one minute"), (90, "one minute and thirty seconds"),
     (3600, "one hour"), (3661, "one hour, one minute and one second"), (0, "zero seconds")],
)
def test_spoken_duration(seconds, spoken):
    assert spoken_duration(seconds) == spoken


@pytest.mark.anyio
@pytest.mark.parametrize(
    "utterance,missing,expected",
    [
        ("what time is it", "get_time", "not available"),
        ("set a timer for 5 minutes", "set_timer", "not available"),
        ("add a note: milk", "add_note", "not available"),
        ("run backup", "run_command", "Commands are not configured."),
    ],
)
async def test_tool_missing_from_schemas_is_never_called(utterance, missing, expected):
    deltas = await ask(utterance, [t for t in ALL_TOOLS if t != missing])
    assert calls_of(deltas) == []
    assert expected in text_of(deltas)
    assert "Done" not in text_of(deltas)
    assert deltas[-1] == Finish("stop")


@pytest.mark.anyio
async def test_a_timer_without_duration_asks_how_long():
    deltas = await ask("set a timer")
    assert calls_of(deltas) == [] and text_of(deltas) == "How long should the timer be?"


@pytest.mark.anyio
async def test_unknown_question_gets_the_llm_hint():
    deltas = await ask("What is the capital of France?")
    assert calls_of(deltas) == []
    assert text_of(deltas) == HINT and "language model" in HINT
    assert deltas[-1] == Finish("stop")


def test_the_hint_is_short_and_speakable():
    """It is spoken: no paths, config keys, URLs or markup (issue #12: Whisper
    heard "point lllum.bac URL until the slash.config slash boys")."""
    assert len(HINT.split()) <= 20
    assert not re.search(r"[/~_`*#\\]|\w\.\w|\$", HINT), HINT


@pytest.mark.anyio
async def test_help_lists_skills():
    text = text_of(await ask("what can you do"))
    assert "timers" in text and "notes" in text and "time" in text


# -- repeating what was heard -------------------------------------------------------


@pytest.mark.anyio
async def test_repeat_says_exactly_what_was_heard():
    heard = "The first point is that the sky"  # an interrupted message, cut to what played
    messages = [
        {"role": "user", "content": "tell me something"},
        {"role": "assistant", "content": "Something older."},
        {"role": "user", "content": "and more"},
        {"role": "assistant", "content": heard},
        {"role": "user", "content": "list timers"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "list_timers", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "x", "content": "[]"},
        {"role": "assistant", "content": "   "},
        {"role": "user", "content": "What did you just say?"},
    ]
    deltas = await collect(messages)
    assert text_of(deltas) == f"I said: {heard}"
    assert calls_of(deltas) == [] and deltas[-1] == Finish("stop")


@pytest.mark.anyio
async def test_repeat_with_nothing_said():
    deltas = await collect([{"role": "system", "content": "sys"}, {"role": "user", "content": "say that again"}])
    assert text_of(deltas) == "I haven't said anything yet."


# -- tool results ----------------------------------------------------------------


def after_call(name: str, content: str, result: ToolResult, call_id: str = "skill_1"):
    """A request answering `result`: its messages (the result rendered as the
    model reads it, which must be `content`) and its structured results."""
    result = replace(result, tool_call_id=call_id, name=name)
    assert tool_result_text(result) == content
    other = ToolResult.ok("other", "get_time", {"spoken": "never this"}, None, None)
    messages = [
        {"role": "user", "content": "older"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "other", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "other", "content": tool_result_text(other)},
        {"role": "user", "content": "now"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call_id, "content": content},
    ]
    return messages, {"other": other, call_id: result}


def ok(content: Any, receipt: str | None = None) -> ToolResult:
    return ToolResult.ok("", "", content, receipt, None)


@pytest.mark.anyio
async def test_time_result_is_spoken():
    content = {"iso": "2025-11-29T23:49:00+01:00", "spoken": "11:49 PM on Sunday, November 29"}
    deltas = await collect(*after_call("get_time", json.dumps(content), ok(content)))
    assert text_of(deltas) == "It is 11:49 PM on Sunday, November 29."
    assert calls_of(deltas) == [] and deltas[-1] == Finish("stop")


@pytest.mark.anyio
@pytest.mark.parametrize(
    "content,expected",
    [
        ({"notes": [{"text": "buy milk"}, {"text": "call Anna"}]}, "You have two notes: buy milk and call Anna."),
        (["buy milk"], "You have one note: buy milk."),
        ({"notes": []}, "You have no notes."),
        ({"count": 12, "notes": [{"text": "a"}, {"text": "b"}]}, "You have twelve notes. The latest two: a and b."),
        ("not json at all", "Here is what I found: not json at all"),
    ],
)
async def test_notes_result_is_summarised(content, expected):
    rendered = content if isinstance(content, str) else json.dumps(content)
    assert text_of(await collect(*after_call("read_notes", rendered, ok(content)))) == expected


@pytest.mark.anyio
async def test_timers_result_is_summarised():
    content = {"timers": [{"label": "pasta", "remaining_s": 90}, {"remaining_s": 10}]}
    text = text_of(await collect(*after_call("list_timers", json.dumps(content), ok(content))))
    assert text == ("You have two timers: the pasta timer with one minute and thirty seconds left"
                    " and a timer with ten seconds left.")


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["set_timer", "cancel_timer", "add_note", "run_command", "get_time", "read_notes"])
@pytest.mark.parametrize(
    "content,why,result",
    [
        ("error: no timer named pasta", "no timer named pasta", ToolResult.failed("", "", "no timer named pasta")),
        ("cancelled: the turn was stopped", "the turn was stopped", ToolResult.stopped("", "", None)),
        ("unknown: the write timed out", "the write timed out",
         ToolResult.failed("", "", "the write timed out", ev.UNKNOWN)),
        ("ABORTED_BEFORE_DISPATCH: the turn was stopped before this call ran", "the turn was stopped before this call ran",
         ToolResult.not_dispatched("", "")),
    ],
)
async def test_failed_results_are_never_claimed_as_done(name, content, why, result):
    deltas = await collect(*after_call(name, content, result))
    text = text_of(deltas)
    assert why in text and text.startswith("Sorry")
    assert "Done" not in text and "saved" not in text and "is set" not in text
    assert deltas[-1] == Finish("stop")


@pytest.mark.anyio
async def test_failure_reason_is_read_from_a_receipt_object():
    content = 'failed: {"cancelled": false, "reason": "no such timer is running"}'
    result = ok({"cancelled": False, "reason": "no such timer is running"}, ev.FAILED)
    text = text_of(await collect(*after_call("cancel_timer", content, result)))
    assert text == "Sorry, cancelling the timer did not work: no such timer is running."


@pytest.mark.anyio
async def test_blocked_repeat_is_not_read_as_an_instruction():
    content = ("blocked: an earlier set_timer with these arguments (turn 3) has an unknown outcome; it was not "
               "repeated. Tell the person it may or may not have happened.")
    result = ToolResult.blocked("", "set_timer", earlier=ev.UNKNOWN, blocked_by="call_3_0_0_0", blocked_turn=3,
                                this_turn=4)
    text = text_of(await collect(*after_call("set_timer", content, result)))
    assert text == "I did not try setting the timer again, because an earlier try may or may not have worked."


@pytest.mark.anyio
async def test_a_declined_call_is_not_read_out_with_its_note_to_the_model():
    """Found on a fresh clone: "no" to a configured command, then the skills
    provider read the result's note to the model aloud ("Sorry, running the
    command did not work: not run: the person declined (they said: 'no'). Do
    not try it again unless they ask."). The answer was already acknowledged."""
    result = ToolResult.declined("", "run_command", "declined", "no")
    deltas = await collect(*after_call("run_command", tool_result_text(result), result))
    assert deltas == [Finish("stop")]
    nobody = ToolResult.declined("", "run_command", "unavailable", "")  # no one was asked: say so, plainly
    text = text_of(await collect(*after_call("run_command", tool_result_text(nobody), nobody)))
    assert text == "Sorry, I could not ask you about running the command here, so I did not do it."


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["set_timer", "cancel_timer", "add_note", "run_command"])
@pytest.mark.parametrize("content,result", [(json.dumps({"ok": True}), ok({"ok": True})),
                                            ('confirmed: {"saved": true}', ok({"saved": True}, ev.CONFIRMED))])
async def test_ok_write_result_streams_nothing(name, content, result):
    deltas = await collect(*after_call(name, content, result))
    assert deltas == [Finish("stop")]


@pytest.mark.anyio
async def test_released_confirmation_is_not_taken_for_a_request():
    # the loop appends the held "Done, ..." after the receipt; it must not set another timer
    messages, results = after_call("set_timer", 'confirmed: {"seconds": 600}', ok({"seconds": 600}, ev.CONFIRMED))
    messages.append({"role": "assistant", "content": "Done, your timer for ten minutes is set."})
    assert await collect(messages, results=results) == [Finish("stop")]
    failed, results = after_call("add_note", 'failed: {"saved": false}', ok({"saved": False}, ev.FAILED))
    failed.append({"role": "assistant", "content": "That didn't work."})
    assert text_of(await collect(failed, results=results)) == "Sorry, saving the note did not work."


@pytest.mark.anyio
async def test_a_result_that_reads_like_a_failure_is_not_one():
    # The rendered text is for a model; only the structured status says what
    # happened: a read whose content begins "error:" did its job.
    content = "error: 3 lines in the log"
    deltas = await collect(*after_call("read_notes", content, ok(content)))
    assert text_of(deltas) == "Here is what I found: error: 3 lines in the log"


@pytest.mark.anyio
async def test_results_missing_from_the_request_are_never_claimed_as_done():
    messages, _ = after_call("add_note", 'confirmed: {"saved": true}', ok({"saved": True}, ev.CONFIRMED))
    assert text_of(await collect(messages)) == "Sorry, I could not tell what came of saving the note."


# -- the stream ------------------------------------------------------------------


@pytest.mark.anyio
async def test_text_pieces_are_words_that_concatenate_exactly():
    deltas = await ask("what is the meaning of life")
    pieces = [d.text for d in deltas if isinstance(d, TextDelta)]
    assert pieces == split_words(HINT) and len(pieces) > 10
    assert "".join(pieces) == HINT


@pytest.mark.anyio
async def test_text_is_paced_by_chunk_delay():
    assert SkillsProvider().chunk_delay_s == 0.02
    start = time.monotonic()
    deltas = await collect([{"role": "user", "content": "help"}], provider=SkillsProvider(chunk_delay_s=0.01))
    words = sum(isinstance(d, TextDelta) for d in deltas)
    assert words > 10 and time.monotonic() - start >= 0.008 * words


@pytest.mark.anyio
async def test_call_ids_are_unique_and_route_is_builtin():
    provider = SkillsProvider(chunk_delay_s=0)
    assert provider.route == ProviderRoute(provider="skills", model="builtin")
    first = await collect([{"role": "user", "content": "time"}], provider=provider)
    second = await collect([{"role": "user", "content": "time"}], provider=provider)
    ids = [d.id for d in first + second if isinstance(d, ToolCallDelta)]
    assert len(ids) == 2 and len(set(ids)) == 2 and all(i.startswith("skill_") for i in ids)
    await provider.aclose()


@pytest.mark.anyio
async def test_time_through_the_agent_loop(store):
    agent, out = text_agent(store, SkillsProvider(chunk_delay_s=0), tools=ToolRegistry([get_time_tool()]))
    result = await agent.run_turn("What time is it?")
    assert result.outcome == "completed"
    assert printed_reply(out).startswith("It is ")
    assert any("get_time -> ok" in line for line in chat_view(store, "c-test"))


@pytest.mark.anyio
async def test_notes_through_the_agent_loop(store, tmp_path):
    out = io.StringIO()
    agent = AgentLoop(store, SkillsProvider(chunk_delay_s=0), TextSurface(out=out), "c-notes",
                      ToolRegistry(notes_tools()), LoopSettings(), ToolEnv(data_dir=tmp_path))
    assert (await agent.run_turn("Add a note: Buy Oat Milk")).outcome == "completed"
    assert printed_reply(out) == "Done, I saved the note."
    assert "Buy Oat Milk" in (tmp_path / "notes.txt").read_text()
    assert (await agent.run_turn("read my notes")).outcome == "completed"
    assert printed_reply(out) == "You have one note: Buy Oat Milk."
    assert (await agent.run_turn("what did you just say")).outcome == "completed"
    assert printed_reply(out) == "I said: You have one note: Buy Oat Milk."
