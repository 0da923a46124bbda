"""Tools that act (docs/ARCHITECTURE.md: I4 I7 I8 I9 I10): receipts, completion
text held until a receipt confirms it, no automatic repeat of an unknown
write, timers from the log, and recovery after a crash."""

from __future__ import annotations

import datetime
import io

import anyio
import pytest

from autojump import on_autojump, virtual_wall
from conftest import printed_reply, run_and_cancel_when, scripted
from voice.agent.effects import effects
from voice.agent.loop import AgentLoop
from voice.agent.loop_settings import LoopSettings, ToolEnv, ToolServices
from voice.agent.recovery import recover
from voice.agent.timer_service import TimerService
from voice.agent.tools.base import Receipt, Tool, ToolOutcome, ToolRegistry
from voice.agent.tools.notes import notes_tools
from voice.agent.tools.timers import timer_tools
from voice.log import events as ev
from voice.log.projections import derive_messages, message_text
from voice.surfaces.text import TextSurface

pytestmark = pytest.mark.anyio

DONE = "Done, I saved the note."


def agent_with(store, provider, tmp_path, *extra: Tool, timers: TimerService | None = None):
    out = io.StringIO()
    tools = ToolRegistry([*notes_tools(), *timer_tools(), *extra])
    env = ToolEnv(data_dir=tmp_path / "data", services=ToolServices(timers=timers))
    agent = AgentLoop(store, provider, TextSurface(out=out), "c-test", tools, LoopSettings(retry_backoff_s=0.01), env)
    return agent, out


def note_then_done(text="buy milk", delay=1):
    return {"chunk_delay_ms": delay, "tool_calls": [{"name": "add_note", "arguments": {"text": text}}]}


def types_of(store, turn):
    return [e.type for e in store.events("c-test", turn=turn)]


def seq_of(store, turn, type_, **match):
    return next(e.seq for e in store.events("c-test", turn=turn)
                if e.type == type_ and all(e.payload.get(k) == v for k, v in match.items()))


class ScriptedWithTrailingText:
    """The skills provider's shape: a write call, then its completion text in
    the same stream (scripted replies stream text first, so build it)."""

    def __init__(self, calls, trailing: str, then: str = ""):
        from voice.agent.providers.base import ProviderRoute
        self.route = ProviderRoute("scripted", "trailing")
        self.calls, self.trailing, self.then, self.requests = calls, trailing, then, []

    async def stream(self, request):
        import json
        from voice.agent.providers.base import Finish, TextDelta, ToolCallDelta
        self.requests.append(request)
        if len(self.requests) == 1:
            for i, (name, args) in enumerate(self.calls):
                yield ToolCallDelta(i, id=f"call_{i}", name=name, arguments=json.dumps(args))
            for word in self.trailing.split(" "):
                await anyio.sleep(0)
                yield TextDelta(word + " ")
            yield Finish("tool_calls")
        else:
            if self.then:
                yield TextDelta(self.then)
            yield Finish("stop")

    async def aclose(self):
        pass


# -- I8: completion phrases wait for receipts ----------------------------------


async def test_completion_text_plays_only_after_a_confirmed_receipt(store, tmp_path):
    provider = ScriptedWithTrailingText([("add_note", {"text": "buy milk"})], DONE)
    agent, out = agent_with(store, provider, tmp_path)
    result = await agent.run_turn("note buy milk")
    assert result.outcome == ev.COMPLETED
    assert DONE in out.getvalue()
    receipt = seq_of(store, result.turn, ev.EFFECT_RECEIPT, state="confirmed")
    spoken = seq_of(store, result.turn, ev.ASSISTANT_MESSAGE, origin="completion")
    assert seq_of(store, result.turn, ev.TOOL_DISPATCH) < receipt < spoken
    first = next(e for e in store.events("c-test", turn=result.turn) if e.type == ev.ASSISTANT_MESSAGE)
    assert first.payload["content"] == []  # the held text is not part of the tool-call message
    notes = (tmp_path / "data" / "notes.txt").read_text()
    assert notes.endswith("\tbuy milk\n")
    (r,) = [e for e in store.events("c-test") if e.type == ev.EFFECT_RECEIPT]
    assert r.payload["evidence"]["offset"] == 0 and len(r.payload["evidence"]["sha256"]) == 64
    history = derive_messages(store, "c-test")
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[2]["content"].startswith("confirmed: ")
    assert history[3]["content"].strip() == DONE


async def test_a_confirmed_write_with_nothing_said_after_it_speaks_the_tools_phrase(store, tmp_path):
    # Most models stream no text after a call. The turn used to end there in
    # silence, recording an empty `origin: completion` message: the person
    # never heard that the note was saved.
    agent, out = agent_with(store, scripted(note_then_done()), tmp_path)
    result = await agent.run_turn("note buy milk")
    assert result.outcome == ev.COMPLETED
    assert printed_reply(out) == DONE  # the tool's own phrase
    messages = [e.payload for e in store.events("c-test", turn=result.turn) if e.type == ev.ASSISTANT_MESSAGE]
    assert [(m.get("origin"), message_text(m), bool(m.get("tool_calls"))) for m in messages] == [
        (None, "", True), ("tool", DONE, False)]
    assert seq_of(store, result.turn, ev.EFFECT_RECEIPT, state="confirmed") < seq_of(
        store, result.turn, ev.ASSISTANT_MESSAGE, origin="tool")
    assert derive_messages(store, "c-test")[-1] == {"role": "assistant", "content": DONE}


async def test_a_confirmed_write_without_a_phrase_lets_the_model_answer(store, tmp_path):
    async def save(args, ctx):
        return ToolOutcome({"saved": True}, Receipt("confirmed"))

    tool = Tool("save", "a write with no phrase of its own", {"type": "object"}, "write", save)
    provider = scripted({"chunk_delay_ms": 1, "tool_calls": [{"name": "save", "arguments": {}}]},
                        {"chunk_delay_ms": 1, "text": "Saved it."})
    agent, out = agent_with(store, provider, tmp_path, tool)
    result = await agent.run_turn("save it")
    assert result.outcome == ev.COMPLETED and printed_reply(out) == "Saved it."
    texts = [message_text(e.payload) for e in store.events("c-test", turn=result.turn) if e.type == ev.ASSISTANT_MESSAGE]
    assert texts == ["", "Saved it."]  # the call, then the answer: no empty message in between


async def test_failed_write_replaces_the_claim_with_an_honest_phrase(store, tmp_path):
    (tmp_path / "data").write_text("a file where the notes folder should be")
    provider = ScriptedWithTrailingText([("add_note", {"text": "buy milk"})], DONE)
    agent, out = agent_with(store, provider, tmp_path)
    result = await agent.run_turn("note buy milk")
    assert DONE not in out.getvalue()
    assert "That didn't work." in out.getvalue()
    assert [e.payload["state"] for e in store.events("c-test") if e.type == ev.EFFECT_RECEIPT] == ["failed"]
    withheld = [e for e in store.events("c-test", turn=result.turn) if e.type == ev.ASSISTANT_ATTEMPT]
    assert withheld and withheld[0].payload["reason"] == "withheld"
    assert DONE not in str(derive_messages(store, "c-test"))


async def test_unknown_write_is_said_to_be_unknown(store, tmp_path):
    async def hangs(args, ctx):
        await anyio.sleep(10)

    slow = Tool("save_remote", "a write that never answers", {"type": "object"}, "write", hangs, timeout_s=0.05)
    provider = ScriptedWithTrailingText([("save_remote", {})], "Done, saved remotely.")
    agent, out = agent_with(store, provider, tmp_path, slow)
    await agent.run_turn("save it")
    assert "Done, saved remotely." not in out.getvalue()
    assert "I couldn't confirm that it worked." in out.getvalue()
    (effect,) = effects(store, "c-test")
    assert effect.state == ev.UNKNOWN and effect.evidence == {"timeout_s": 0.05}


async def test_cancel_between_dispatch_and_receipt_is_unknown_and_says_nothing(store, tmp_path):
    started = anyio.Event()

    async def slow_write(args, ctx):
        started.set()
        await anyio.sleep(10)
        return ToolOutcome("ok", Receipt("confirmed"))

    tool = Tool("slow_write", "slow", {"type": "object"}, "write", slow_write, timeout_s=30)
    provider = ScriptedWithTrailingText([("slow_write", {})], "Done, it is written.")
    agent, out = agent_with(store, provider, tmp_path, tool)
    result = await run_and_cancel_when(agent, "write it", started.is_set)
    assert result.outcome == ev.ABORTED
    assert "Done" not in out.getvalue()
    (effect,) = effects(store, "c-test")
    assert effect.state == ev.UNKNOWN and "cancelled" in effect.evidence
    (res,) = [e for e in store.events("c-test") if e.type == ev.TOOL_RESULT]
    assert res.payload["status"] == "cancelled" and res.payload["receipt"] == ev.UNKNOWN


# -- I4: interrupted content never holds an undispatched call -------------------


async def test_undispatched_calls_get_aborted_results_and_no_effect(store, tmp_path):
    started = anyio.Event()

    async def slow_read(args, ctx):
        started.set()
        await anyio.sleep(10)

    tool = Tool("slow_read", "slow", {"type": "object"}, "read", slow_read, timeout_s=30)
    provider = scripted({"chunk_delay_ms": 1, "tool_calls": [
        {"name": "slow_read", "arguments": {}}, {"name": "add_note", "arguments": {"text": "never"}}]})
    agent, _ = agent_with(store, provider, tmp_path, tool)
    await run_and_cancel_when(agent, "go", started.is_set)
    results = {e.payload["name"]: e.payload["status"] for e in store.events("c-test") if e.type == ev.TOOL_RESULT}
    assert results == {"slow_read": "cancelled", "add_note": ev.ABORTED_BEFORE_DISPATCH}
    assert not (tmp_path / "data" / "notes.txt").exists()
    assert effects(store, "c-test") == []


# -- I9: an unknown write is never repeated automatically -----------------------


async def test_a_repeat_of_an_unknown_write_is_blocked(store, tmp_path):
    runs = []

    async def flaky(args, ctx):
        runs.append(args)
        await anyio.sleep(10)

    tool = Tool("transfer", "moves money", {"type": "object"}, "write", flaky, timeout_s=0.05)
    provider = scripted({"chunk_delay_ms": 1, "tool_calls": [{"name": "transfer", "arguments": {"amount": 5}}]},
                        {"chunk_delay_ms": 1, "text": "Let me try again."},
                        {"chunk_delay_ms": 1, "tool_calls": [{"name": "transfer", "arguments": {"amount": 5}}]},
                        {"chunk_delay_ms": 1, "text": "It may or may not have happened."})
    agent, out = agent_with(store, provider, tmp_path, tool)
    await agent.run_turn("send five")
    await agent.run_turn("try again")
    assert runs == [{"amount": 5}]  # run once, never again
    blocked = [e for e in store.events("c-test") if e.type == ev.TOOL_RESULT and e.payload["status"] == ev.BLOCKED]
    assert len(blocked) == 1 and "unknown outcome" in blocked[0].payload["error"]
    assert [e.state for e in effects(store, "c-test")] == [ev.UNKNOWN]


async def test_a_stop_while_an_earlier_unknown_write_is_looked_up_leaves_no_call_without_a_result(store, tmp_path):
    # A repeat of an unknown write first asks reconcile() what became of the
    # earlier one. A stop during that look used to leave the call with no
    # result at all (no longer pending, never dispatched): every later
    # request then carried a tool call without its answer.
    looking = anyio.Event()

    async def never_answers(args, ctx):
        await anyio.sleep(10)

    async def slow_look(args, dispatch, ctx):
        looking.set()
        await anyio.sleep(10)
        return Receipt("unknown")

    tool = Tool("transfer", "moves money", {"type": "object"}, "write", never_answers, timeout_s=0.05,
                reconcile=slow_look)
    call = {"name": "transfer", "arguments": {"amount": 5}}
    provider = scripted({"chunk_delay_ms": 1, "tool_calls": [call]},
                        {"chunk_delay_ms": 1, "text": "It may or may not have happened."},
                        {"chunk_delay_ms": 1, "tool_calls": [call]})
    agent, _ = agent_with(store, provider, tmp_path, tool)
    await agent.run_turn("send five")
    result = await run_and_cancel_when(agent, "try again", looking.is_set)
    assert result.outcome == ev.ABORTED
    (called,) = [e.payload["tool_call_id"] for e in store.events("c-test", turn=result.turn) if e.type == ev.TOOL_CALL]
    results = [(e.payload["tool_call_id"], e.payload["status"])
               for e in store.events("c-test", turn=result.turn) if e.type == ev.TOOL_RESULT]
    assert results == [(called, ev.ABORTED_BEFORE_DISPATCH)]
    history = derive_messages(store, "c-test")
    answered = {m["tool_call_id"] for m in history if m["role"] == "tool"}
    assert all(c["id"] in answered for m in history for c in m.get("tool_calls", []))


async def test_a_model_repeating_a_confirmed_write_in_the_same_turn_is_blocked(store, tmp_path):
    call = {"name": "add_note", "arguments": {"text": "buy milk"}}
    provider = scripted({"chunk_delay_ms": 1, "tool_calls": [call, call, call]})
    agent, out = agent_with(store, provider, tmp_path)
    await agent.run_turn("note buy milk")
    results = [e.payload for e in store.events("c-test") if e.type == ev.TOOL_RESULT]
    assert [r["status"] for r in results] == ["ok", ev.BLOCKED, ev.BLOCKED]
    assert "earlier in this turn" in results[1]["error"]
    assert (tmp_path / "data" / "notes.txt").read_text().count("buy milk") == 1


async def test_reconcile_resolves_an_unknown_note_without_writing_it_again(store, tmp_path):
    # A crash after the write reached the file but before the receipt.
    (tmp_path / "data").mkdir()
    turn = store.start_turn("c-test", ev.TurnStart(source="text"))
    # (rows recorded as bodies: the untyped `append` these used is gone, #25)
    at = {"turn": turn, "step": 0, "attempt": 0}
    store.record("c-test", ev.UserMessage(content="note buy milk"), turn=turn)
    store.record("c-test", ev.StepStart(), **at)
    store.record("c-test", ev.AssistantMessage(message_id=f"{turn}.0.0", content=[], tool_calls=[
        {"id": "call_x", "type": "function", "function": {"name": "add_note", "arguments": '{"text": "buy milk"}'}}]),
        **at)
    store.record("c-test", ev.ToolCalled(tool_call_id="call_x", name="add_note"), **at)
    store.record("c-test", ev.ToolDispatched(tool_call_id="call_x", name="add_note", effect="write",
                                             arguments={"text": "buy milk"}), **at)
    # the note reached the file after the dispatch (a line is stamped when it is written)
    (tmp_path / "data" / "notes.txt").write_text(f"{datetime.datetime.now():%Y-%m-%d %H:%M:%S}\tbuy milk\n")
    env = ToolEnv(data_dir=tmp_path / "data")
    report = await recover(store, ToolRegistry(notes_tools()), env)
    assert report.closed_turns == [("c-test", turn)] and report.unknown_writes == 1 and report.reconciled == 1
    (effect,) = effects(store, "c-test")
    assert effect.state == "reconciled" and effect.outcome == ev.CONFIRMED
    assert (tmp_path / "data" / "notes.txt").read_text().count("buy milk") == 1
    end = [e for e in store.events("c-test", turn=turn) if e.type == ev.TURN_END]
    assert [e.payload["outcome"] for e in end] == [ev.INTERRUPTED]
    # history stays well-formed: the call has a result
    history = derive_messages(store, "c-test")
    assert history[-1]["role"] == "tool" and history[-1]["tool_call_id"] == "call_x"
    # a second start finds nothing more to do
    again = await recover(store, ToolRegistry(notes_tools()), env)
    assert again.closed_turns == [] and again.reconciled == 0


async def test_recovery_never_revives_a_stopped_turn(store, tmp_path):
    provider = scripted({"text": "A long answer that the person stops.", "chunk_delay_ms": 20})
    agent, out = agent_with(store, provider, tmp_path)
    await run_and_cancel_when(agent, "talk", lambda: "long" in out.getvalue())
    before = store.last_seq()
    report = await recover(store, ToolRegistry(notes_tools()), ToolEnv(data_dir=tmp_path))
    assert report.closed_turns == [] and store.last_seq() == before
    assert len(provider.requests) == 1


# -- timers ----------------------------------------------------------------------


@on_autojump  # the timer's second passes on the virtual clock: no real waiting
async def test_a_timer_announces_itself_when_due(store, tmp_path):
    said = []
    announced = anyio.Event()

    async def announce(text):
        said.append(text)
        announced.set()

    timers = TimerService(store, announce, clock=virtual_wall())
    provider = ScriptedWithTrailingText([("set_timer", {"seconds": 1})], "Done, your timer is set.")
    agent, out = agent_with(store, provider, tmp_path, timers=timers)
    async with anyio.create_task_group() as tg:
        tg.start_soon(timers.run)
        await agent.run_turn("timer one second")
        with anyio.fail_after(5):  # virtual seconds: a deadline for a hang
            await announced.wait()
        tg.cancel_scope.cancel()
    assert said == ["Your one second timer is done."]
    assert "Done, your timer is set." in out.getvalue()
    assert timers.active() == []


@on_autojump  # was 1.5 s of real sleeping; the same waits now cost no real time
async def test_a_cancelled_timer_never_speaks(store, tmp_path):
    said = []

    async def announce(text):
        said.append(text)

    timers = TimerService(store, announce, clock=virtual_wall())
    timer, _ = timers.set(1, "tea", "c-test", None, None)
    async with anyio.create_task_group() as tg:
        tg.start_soon(timers.run)
        await anyio.sleep(0.2)  # virtual: the service is waiting for the due time
        assert timers.cancel("tea", "c-test", None) == timer
        await anyio.sleep(1.3)  # virtual: past the cancelled timer's due time
        tg.cancel_scope.cancel()
    assert said == []
    assert not [e for e in store.events() if e.type == ev.TIMER_FIRED]


@on_autojump  # the restarts' short waits cost no real time
async def test_a_timer_due_while_down_is_announced_once_as_late(store):
    said = []

    async def announce(text):
        said.append(text)

    clock = [1000.0]
    timers = TimerService(store, announce, clock=lambda: clock[0])
    timers.set(60, "", "c-test", None, None)
    clock[0] += 600  # the assistant was down for ten minutes
    for _ in range(2):  # two restarts
        restarted = TimerService(store, announce, clock=lambda: clock[0])
        async with anyio.create_task_group() as tg:
            tg.start_soon(restarted.run)
            await anyio.sleep(0.05)  # virtual: the restarted service has read the log and gone idle
            tg.cancel_scope.cancel()
    assert said == ["Your one minute timer went off nine minutes ago, while I was not running."]
    (fired,) = [e for e in store.events() if e.type == ev.TIMER_FIRED]
    assert fired.payload["late"] is True


# -- one terminal outcome --------------------------------------------------------


@on_autojump  # the stream's chunk delays and the stop's delay on one virtual clock: a loaded machine cannot skew the race
async def test_a_stop_racing_completion_yields_one_outcome(store, tmp_path):
    import random

    rng = random.Random(7)
    outcomes = []
    for i in range(40):
        provider = scripted({"text": "Quick reply here.", "chunk_delay_ms": 2})
        agent, _ = agent_with(store, provider, tmp_path)
        async with anyio.create_task_group() as tg:
            results = []

            async def turn():
                results.append(await agent.run_turn(f"q{i}"))

            tg.start_soon(turn)
            await anyio.sleep(rng.uniform(0.0, 0.012))  # around the end of the stream
            agent.cancel()
        outcomes.append(results[0].outcome)
        ends = [e for e in store.events("c-test", turn=results[0].turn) if e.type == ev.TURN_END]
        assert len(ends) == 1 and ends[0].payload["outcome"] == results[0].outcome
    assert set(outcomes) <= {ev.COMPLETED, ev.ABORTED}
    assert ev.COMPLETED in outcomes and ev.ABORTED in outcomes, outcomes  # both sides of the race were hit
