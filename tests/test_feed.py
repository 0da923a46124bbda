"""The in-process feed of committed events (what `voice ctl events` follows
instead of polling SQLite): every commit reaches every subscriber in order,
a subscriber that falls behind is dropped and told so without ever holding
up a writer, and `follow` joins the log's backlog to the live feed with no
gap and no repeat."""

from __future__ import annotations

from contextlib import aclosing

import anyio
import pytest

from voice.log import events as ev
from voice.log.feed import follow
from voice.log.store import EventStore

pytestmark = pytest.mark.anyio


def write_a_turn(store: EventStore, conversation: str = "c-a") -> int:
    turn = store.start_turn(conversation, ev.TurnStart(source="text"))
    store.record(conversation, ev.UserMessage(content="hi"), turn=turn)
    # (was the untyped `append`, removed in #25: `record` is the one recording path)
    store.record(conversation, ev.StepStart(), turn=turn, step=0, attempt=0)
    store.end_turn(conversation, turn, ev.COMPLETED)
    return turn


async def drain(subscription) -> list[ev.Event]:
    with anyio.fail_after(5):
        return [e async for e in subscription]


async def test_every_commit_reaches_every_subscriber_in_order(store):
    with store.subscribe() as first, store.subscribe() as second:
        write_a_turn(store)
        store.copy_events(store.events("c-a"), "c-fork")
        store.close()  # ends both subscriptions after what they hold
        got_first, got_second = await drain(first), await drain(second)
    assert [e.seq for e in got_first] == list(range(1, 9))
    assert got_first == got_second
    assert [(e.conversation, e.type) for e in got_first[:4]] == [
        ("c-a", ev.TURN_START), ("c-a", ev.USER_MESSAGE), ("c-a", ev.STEP_START), ("c-a", ev.TURN_END)]
    assert {e.conversation for e in got_first[4:]} == {"c-fork"}
    assert not first.lagged and not second.lagged


async def test_subscribers_see_what_the_log_holds(tmp_path):
    store = EventStore(tmp_path / "events.db")
    with store.subscribe() as live:
        write_a_turn(store)
        rows = store.events()
        store.close()
        got = await drain(live)
    assert [e.to_json() for e in got] == [e.to_json() for e in rows]
    assert [e.body for e in got] == [e.body for e in rows]


async def test_a_subscriber_that_falls_behind_is_dropped_and_told(store):
    with store.subscribe(max_buffer=3) as slow, store.subscribe() as keeping_up:
        for n in range(10):  # nobody reads meanwhile: the writer must not wait
            with anyio.fail_after(1):
                store.record("c-a", ev.UserMessage(content=f"{n}"))
        assert slow.lagged
        assert [e.body.content for e in await drain(slow)] == ["0", "1", "2"]  # what it held, then the end
        store.record("c-a", ev.UserMessage(content="after"))
        store.close()
        assert [e.body.content for e in await drain(keeping_up)] == [f"{n}" for n in range(10)] + ["after"]
        assert not keeping_up.lagged


async def test_a_subscriber_that_left_is_forgotten(store):
    with store.subscribe() as gone:
        pass
    assert gone not in store.feed._subscribers
    store.record("c-a", ev.UserMessage(content="still written"))
    assert [e.body.content for e in store.events()] == ["still written"]


async def test_follow_joins_the_backlog_and_the_live_feed(store):
    for n in range(5):
        store.record("c-a", ev.UserMessage(content=f"old {n}"))
    seen: list[str] = []
    subscriptions = []
    subscribe = store.subscribe
    store.subscribe = lambda max_buffer: subscriptions.append(subscribe(max_buffer)) or subscriptions[-1]

    async def follower(task_status=anyio.TASK_STATUS_IGNORED):
        # a tiny buffer: the follower falls behind the writer over and over
        async with aclosing(follow(store, after_seq=2, max_buffer=2)) as events:
            task_status.started()
            async for event in events:
                seen.append(event.body.content)
                await anyio.sleep(0.002)  # slower than the writer

    async with anyio.create_task_group() as tg:
        await tg.start(follower)
        for n in range(30):
            store.record("c-a", ev.UserMessage(content=f"new {n}"))
            if n % 7 == 0:
                await anyio.sleep(0.003)
        with anyio.fail_after(5):
            while len(seen) < 33:
                await anyio.sleep(0.01)
        store.close()  # ends the follower
    assert seen == [f"old {n}" for n in range(2, 5)] + [f"new {n}" for n in range(30)]
    assert any(s.lagged for s in subscriptions)  # it did fall behind, and caught up from the log


async def test_follow_of_a_closed_log_ends(store):
    store.record("c-a", ev.UserMessage(content="only"))
    got = []
    async with aclosing(follow(store, after_seq=0)) as events:
        async for event in events:
            got.append(event.body.content)
            store.close()
    assert got == ["only"]
