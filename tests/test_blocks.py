"""BlockAssembler (voice/agent/blocks.py): provider deltas -> ordered content
blocks, the interrupted view of a stream, tool calls and the timed stream."""

from __future__ import annotations

import time

import pytest

from voice.agent.blocks import Block, BlockAssembler, ToolCall
from voice.agent.providers.base import Finish, OtherDelta, ReasoningDelta, TextDelta, ToolCallDelta

pytestmark = pytest.mark.timeout(30)


def feed(*deltas) -> BlockAssembler:
    a = BlockAssembler()
    for d in deltas:
        a.feed(d)
    return a


def kinds(blocks: list[Block]) -> list[tuple[str, str]]:
    return [(b.type, b.text) for b in blocks]


# --- interrupted_blocks -------------------------------------------------------


def test_text_only():
    a = feed(TextDelta("Hello"), TextDelta(" there."), Finish("stop"))
    assert kinds(a.interrupted_blocks()) == [("text", "Hello there.")]


def test_reasoning_then_text_keeps_order_and_both():
    a = feed(ReasoningDelta("Think"), ReasoningDelta(" first."), TextDelta("Answer"), TextDelta(" now."))
    assert kinds(a.interrupted_blocks()) == [("reasoning", "Think first."), ("text", "Answer now.")]


def test_open_text_block_is_returned():
    a = feed(TextDelta("First point."), TextDelta(" Second"))
    blocks = a.interrupted_blocks()
    assert kinds(blocks) == [("text", "First point. Second")]
    assert blocks[0].closed is False


def test_open_reasoning_block_is_returned():
    a = feed(ReasoningDelta("Let me see"))
    assert kinds(a.interrupted_blocks()) == [("reasoning", "Let me see")]


@pytest.mark.parametrize("finish", [True, False])
def test_whitespace_only_and_empty_blocks_are_omitted(finish):
    deltas = [
        ReasoningDelta("  \n "),
        TextDelta(""),
        ToolCallDelta(0, "call_a", "get_time", ""),
        TextDelta(" \t"),
        ToolCallDelta(1, "call_b", "get_time", "{}"),
        ReasoningDelta("real thought"),
        TextDelta("\n"),
    ]
    if finish:
        deltas.append(Finish("stop"))
    a = feed(*deltas)
    # the whitespace blocks did exist; the view drops them
    assert [b.type for b in a.blocks] == ["reasoning", "text", "tool_call", "text", "tool_call", "reasoning", "text"]
    assert kinds(a.interrupted_blocks()) == [("reasoning", "real thought")]


def test_only_empty_stream_gives_nothing():
    assert feed(TextDelta(""), Finish("stop")).interrupted_blocks() == []
    assert feed(Finish("stop")).interrupted_blocks() == []
    assert BlockAssembler().interrupted_blocks() == []


def test_tool_call_blocks_are_omitted():
    a = feed(ToolCallDelta(0, "call_1", "get_time", '{"tz": "UTC"}'))
    assert a.interrupted_blocks() == []
    a.feed(Finish("tool_calls"))
    assert a.interrupted_blocks() == []
    assert a.tool_calls()[0].name == "get_time"


@pytest.mark.parametrize("close", [True, False])
def test_unknown_kind_blocks_are_omitted_open_or_closed(close):
    deltas = [TextDelta("Sure."), OtherDelta("refusal", "I cannot help with that.")]
    if close:
        deltas.append(Finish("stop"))
    a = feed(*deltas)
    assert [b.type for b in a.blocks] == ["text", "refusal"]
    assert a.blocks[-1].text == "I cannot help with that."
    assert a.blocks[-1].closed is close
    assert kinds(a.interrupted_blocks()) == [("text", "Sure.")]


def test_unknown_kind_between_text_blocks_is_omitted_and_splits_them():
    a = feed(TextDelta("One."), OtherDelta("refusal", "no"), OtherDelta("audio", {"id": "x"}), TextDelta(" Two."))
    assert [b.type for b in a.blocks] == ["text", "refusal", "audio", "text"]
    assert kinds(a.interrupted_blocks()) == [("text", "One."), ("text", " Two.")]


def test_text_tool_call_text_gives_two_text_blocks_in_order():
    a = feed(
        TextDelta("Let me check."),
        ToolCallDelta(0, "call_1", "get_time", "{}"),
        TextDelta(" It is noon."),
    )
    blocks = a.interrupted_blocks()
    assert kinds(blocks) == [("text", "Let me check."), ("text", " It is noon.")]
    assert [b.closed for b in blocks] == [True, False]


def test_closed_and_open_flags():
    a = BlockAssembler()
    a.feed(TextDelta("a"))
    assert [b.closed for b in a.blocks] == [False]
    a.feed(TextDelta("b"))  # same kind: same block, still open
    assert [b.closed for b in a.blocks] == [False]
    a.feed(ReasoningDelta("r"))  # another kind closes the text block
    assert [(b.type, b.closed) for b in a.blocks] == [("text", True), ("reasoning", False)]
    a.feed(ToolCallDelta(0, "c0", "get_time"))
    assert [(b.type, b.closed) for b in a.blocks] == [("text", True), ("reasoning", True), ("tool_call", False)]
    a.feed(ToolCallDelta(0, arguments="{}"))  # same index: same block
    assert len(a.blocks) == 3 and a.blocks[-1].closed is False
    a.feed(ToolCallDelta(1, "c1", "get_time"))  # a new index closes the previous call
    assert [b.closed for b in a.blocks] == [True, True, True, False]
    a.feed(OtherDelta("refusal", "x"))
    assert [b.closed for b in a.blocks] == [True, True, True, True, False]
    a.feed(Finish("stop"))
    assert all(b.closed for b in a.blocks)
    assert a.finish_reason == "stop"


def test_close_is_idempotent_and_new_delta_after_close_opens_a_new_block():
    a = feed(TextDelta("one"))
    a.close()
    a.close()
    assert [b.closed for b in a.blocks] == [True]
    a.feed(TextDelta("two"))
    assert kinds(a.blocks) == [("text", "one"), ("text", "two")]
    assert [b.closed for b in a.blocks] == [True, False]


# --- tool calls ---------------------------------------------------------------


def test_tool_call_deltas_assemble_into_two_calls():
    a = feed(
        ToolCallDelta(0, id="call_a", name="get_time"),
        ToolCallDelta(0, arguments='{"tz":'),
        ToolCallDelta(0, arguments=' "UTC"}'),
        ToolCallDelta(1, id="call_b", name="set_timer"),
        ToolCallDelta(1, arguments='{"seconds"'),
        ToolCallDelta(1, arguments=": 60}"),
        Finish("tool_calls"),
    )
    calls = a.tool_calls()
    assert calls == [
        ToolCall("call_a", "get_time", '{"tz": "UTC"}'),
        ToolCall("call_b", "set_timer", '{"seconds": 60}'),
    ]
    assert calls[0].arguments() == {"tz": "UTC"}
    assert calls[1].arguments() == {"seconds": 60}
    assert a.finish_reason == "tool_calls"
    assert calls[1].to_openai() == {
        "id": "call_b", "type": "function", "function": {"name": "set_timer", "arguments": '{"seconds": 60}'}
    }


def test_tool_call_id_and_name_arrive_once_and_are_not_overwritten():
    a = feed(
        ToolCallDelta(0, id="call_x", name="get_time", arguments="{"),
        ToolCallDelta(0, id="other", name="other", arguments="}"),
    )
    assert a.tool_calls() == [ToolCall("call_x", "get_time", "{}")]


def test_tool_call_without_id_gets_a_generated_one():
    a = feed(ToolCallDelta(0, name="get_time"), ToolCallDelta(1, name="get_time"))
    calls = a.tool_calls()
    assert [c.id for c in calls] == ["call_0", "call_1"]
    assert len({c.id for c in calls}) == 2


def test_tool_call_block_json():
    a = feed(ToolCallDelta(0, "call_1", "get_time", "{}"))
    assert a.blocks[0].to_json() == {"type": "tool_call", "id": "call_1", "name": "get_time", "arguments": "{}"}


@pytest.mark.parametrize("raw", ["", "   ", "\n"])
def test_tool_call_arguments_empty_is_empty_object(raw):
    assert ToolCall("c", "get_time", raw).arguments() == {}


def test_tool_call_arguments_parses_json():
    assert ToolCall("c", "t", '{"a": [1, 2], "b": {"c": null}}').arguments() == {"a": [1, 2], "b": {"c": None}}


@pytest.mark.parametrize("raw", ['{"seconds": ', "{'a': 1}", "not json", '{"a": 1} trailing'])
def test_tool_call_arguments_invalid_json_raises(raw):
    with pytest.raises(ValueError, match="set_timer"):
        ToolCall("c", "set_timer", raw).arguments()


@pytest.mark.parametrize("raw", ["[1, 2]", '"text"', "42", "null", "true"])
def test_tool_call_arguments_non_object_raises(raw):
    with pytest.raises(ValueError, match="JSON object"):
        ToolCall("c", "set_timer", raw).arguments()


# --- timed stream, text, content blocks -------------------------------------------


def test_timed_stream_records_every_delta_in_order():
    deltas = [
        ReasoningDelta("hmm"),
        TextDelta("Hi"),
        ToolCallDelta(0, "call_1", "get_time", "{}"),
        OtherDelta("refusal", {"why": "policy"}),
        TextDelta(" there"),
        Finish("stop"),
    ]
    a = BlockAssembler()
    for n, d in enumerate(deltas):
        a.feed(d)
        if n == 2:
            time.sleep(0.03)
    stream = a.timed_stream
    assert [entry[1:] for entry in stream] == [
        ["reasoning", "hmm"],
        ["text", "Hi"],
        ["tool_call", {"index": 0, "id": "call_1", "name": "get_time", "arguments": "{}"}],
        ["refusal", {"why": "policy"}],
        ["text", " there"],
        ["finish", "stop"],
    ]
    offsets = [entry[0] for entry in stream]
    assert all(isinstance(o, float) and o >= 0 for o in offsets)
    assert offsets == sorted(offsets)
    assert offsets[3] - offsets[2] >= 25  # the pause shows, in milliseconds
    assert stream[-1][1] == "finish"


def test_note_error_is_recorded_in_the_stream():
    a = feed(TextDelta("Half"))
    a.note_error("connection reset")
    assert a.timed_stream[-1][1:] == ["error", "connection reset"]
    assert a.timed_stream[-1][0] >= a.timed_stream[0][0]


def test_text_concatenates_text_blocks_only():
    a = feed(
        ReasoningDelta("secret thoughts"),
        TextDelta("Let me check."),
        ToolCallDelta(0, "c", "get_time", "{}"),
        OtherDelta("refusal", "nope"),
        TextDelta(" It is"),
        TextDelta(" noon."),
        Finish("stop"),
    )
    assert a.text() == "Let me check. It is noon."
    assert BlockAssembler().text() == ""


def test_content_blocks():
    a = feed(
        ReasoningDelta("Think."),
        TextDelta("Answer."),
        ToolCallDelta(0, "c", "get_time", "{}"),
        TextDelta("   "),
        OtherDelta("refusal", "no"),
        TextDelta(" More."),
        Finish("stop"),
    )
    assert a.content_blocks() == [
        {"type": "reasoning", "text": "Think."},
        {"type": "text", "text": "Answer."},
        {"type": "text", "text": " More."},
    ]


def test_feeding_a_non_delta_raises():
    with pytest.raises(TypeError):
        BlockAssembler().feed("text")  # type: ignore[arg-type]


def test_stream_offsets_follow_the_virtual_clock_installed_after_import():
    # `voice replay` installs its virtual clock after voice.agent.blocks is
    # imported; the stream's offsets must still be measured on that clock
    # (the start was taken from the real one: offsets were off by every
    # second the clock had skipped).
    from voice.audio.clock import VirtualClock

    clock = VirtualClock()
    clock.offset = 3600.0  # an hour of idle time skipped
    clock.install()
    try:
        a = BlockAssembler()
        a.feed(TextDelta("Hi"))
    finally:
        clock.uninstall()
    assert 0 <= a.timed_stream[0][0] < 1000
