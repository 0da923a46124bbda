"""Every request fits (issue #14): the context window in `derive_messages`
(whole turns, newest first; a tool call never without its result, an
interrupted reply never without its marker; a summary in place of the turns
it covers), the shorter retry after a server's "context length exceeded"
(against the loopback server), and model summaries of dropped turns."""

from __future__ import annotations

import pytest

from conftest import scripted, text_agent
from loopback_llm import LoopbackLLM
from voice.settings import Settings
from voice.agent.loop import AgentLoop
from voice.agent.loop_settings import LoopSettings
from voice.agent.providers.openai_compat import OpenAICompatibleProvider
from voice.agent.tools import default_tools
from voice.log import events as ev
from voice.log.projections import derive_messages, fork, format_trajectory, provider_messages, trajectory
from voice.log.window import derive_window, estimate_tokens, message_tokens
from voice.surfaces.text import TextSurface

C = "c-test"


def finished_turn(store, request: str, reply: str, outcome: str = ev.COMPLETED, **flags) -> int:
    """A turn that ended: the person's request and the reply they heard."""
    turn = store.start_turn(C, ev.TurnStart(source="text"))
    store.record(C, ev.UserMessage(content=request), turn=turn)
    store.record(C, ev.AssistantMessage(message_id=f"m{turn}", content=[{"type": "text", "text": reply}], **flags),
                 turn=turn, step=0, attempt=0)
    store.end_turn(C, turn, outcome)
    return turn


def chat_turn(store, n: int, size: int = 120) -> int:
    """A request and a reply of about `size` characters each."""
    return finished_turn(store, f"chat: question {n} " + "x" * size, f"answer {n} " + "y" * size)


def tool_turn(store, n: int) -> int:
    """A turn whose model called a tool, then answered from its result."""
    turn = store.start_turn(C, ev.TurnStart(source="text"))
    store.record(C, ev.UserMessage(content=f"what time is it {n}"), turn=turn)
    call = {"id": f"call_{turn}_0_0_0", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    store.record(C, ev.AssistantMessage(message_id=f"m{turn}a", content=[], tool_calls=[call]), turn=turn, step=0,
                 attempt=0)
    store.record(C, ev.ToolResult.ok(call["id"], "get_time", "12:00", None, None), turn=turn, step=0, attempt=0)
    store.record(C, ev.AssistantMessage(message_id=f"m{turn}b", content=[{"type": "text", "text": "It is noon."}]),
                 turn=turn, step=1, attempt=0)
    store.end_turn(C, turn, ev.COMPLETED)
    return turn


def cut_turn(store, n: int) -> int:
    """A turn whose reply the person cut: what they heard, marked interrupted."""
    return finished_turn(store, f"tell me a story {n}", "Once upon a time", ev.ABORTED, interrupted=True,
                         surfaceOp="append")


def turn_cost(store, turn: int) -> int:
    return derive_window(store, C, None, upto=turn).tokens - derive_window(store, C, None, upto=turn - 1).tokens


def test_without_a_budget_every_turn_is_history(store):
    turns = [chat_turn(store, n) for n in range(5)]
    assert len(derive_messages(store, C)) == 2 * len(turns)


def test_a_budget_keeps_the_newest_whole_turns_that_fit(store):
    turns = [chat_turn(store, n) for n in range(10)]
    per_turn = turn_cost(store, turns[-1])
    budget = 3 * per_turn + per_turn // 2  # room for three and a half turns: three fit
    window = derive_window(store, C, budget)
    assert window.turns == turns[-3:]
    assert window.tokens <= budget
    assert window.dropped == (turns[0], turns[-4])
    messages = derive_messages(store, C, budget=budget)
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3
    assert messages[0]["content"].startswith("chat: question 7")


def test_a_tool_call_leaves_the_window_with_its_result(store):
    chat_turn(store, 0)
    tools = tool_turn(store, 1)
    last = chat_turn(store, 2)
    cost_tools, cost_last = turn_cost(store, tools), turn_cost(store, last)
    # One token short of the tool turn: it leaves whole, call and result together.
    messages = derive_messages(store, C, budget=cost_last + cost_tools - 1)
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert not any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    # Exactly enough: it stays whole.
    messages = derive_messages(store, C, budget=cost_last + cost_tools)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    call_ids = {c["id"] for m in messages for c in m.get("tool_calls", [])}
    assert call_ids == {m["tool_call_id"] for m in messages if m["role"] == "tool"}


def test_an_interrupted_reply_keeps_its_marker_at_the_window_edge(store):
    for n in range(3):
        chat_turn(store, n)
    cut = cut_turn(store, 3)
    last = chat_turn(store, 4)
    messages = derive_messages(store, C, budget=turn_cost(store, cut) + turn_cost(store, last))
    assert messages[0] == {"role": "user", "content": "tell me a story 3"}
    assert messages[1] == {"role": "assistant", "content": "Once upon a time", "interrupted": True}
    assert len(messages) == 4


def test_the_newest_turn_is_kept_even_alone_over_the_budget(store):
    chat_turn(store, 0)
    last = chat_turn(store, 1, size=4000)
    assert derive_window(store, C, 10).turns == [last]


def test_a_summary_takes_the_place_of_the_turns_it_covers(store, tmp_path):
    turns = [chat_turn(store, n) for n in range(6)]
    store.record(C, ev.ConversationSummary(text="They asked six questions.", first_turn=turns[0], last_turn=turns[3]),
                 turn=turns[-1], step=1000, attempt=0)
    messages = derive_messages(store, C)
    assert messages[0]["role"] == "system" and "They asked six questions." in messages[0]["content"]
    assert messages[0]["summary"] == [turns[0], turns[3]]
    assert [m["content"].split()[:3] for m in messages[1::2]] == [["chat:", "question", "4"], ["chat:", "question", "5"]]
    # A request: the summary joins the system prompt (one system message).
    request = provider_messages(messages, "Be brief.")
    assert request[0]["role"] == "system" and request[0]["content"].startswith("Be brief.\n\nSummary of")
    assert [m["role"] for m in request].count("system") == 1 and "summary" not in request[0]
    # The trace of the turn it was written after shows it; a fork carries it.
    records, _ = trajectory(store, C, turns[-1])
    assert "summary of turns" in format_trajectory(turns[-1], records, None)
    forked = fork(store, C, turns[-1])
    assert derive_messages(store, forked) == messages
    # History up to a turn the summary does not reach has no summary.
    assert "summary" not in derive_messages(store, C, upto=turns[2])[0]


def test_the_estimate_counts_tool_calls_and_overhead():
    call = {"function": {"name": "add_note", "arguments": '{"text": "milk"}'}}
    assert message_tokens({"role": "assistant", "content": "", "tool_calls": [call]}) == \
        estimate_tokens('add_note{"text": "milk"}') + 4
    assert estimate_tokens("abcdef") == 2 and estimate_tokens("abcdefg") == 3


# -- against a server --------------------------------------------------------


def server_agent(store, server: LoopbackLLM, **settings) -> AgentLoop:
    provider = OpenAICompatibleProvider(server.base_url, "m", timeout_s=5)
    return AgentLoop(store, provider, TextSurface(out=open("/dev/null", "w")), C, default_tools(),
                     LoopSettings(retry_backoff_s=0.01, **settings))


@pytest.mark.anyio
async def test_a_context_length_refusal_gets_one_shorter_request(store):
    # 14 turns fill the budget as estimated (more would move the window down to half the budget first,
    # voice.agent.moving_window): the server, counting more, refuses the request all the same.
    for n in range(14):
        chat_turn(store, n)
    with LoopbackLLM(n_ctx=1500) as server:  # it counts a token per 2 characters, the estimate one per 3
        agent = server_agent(store, server, context_tokens=2048, reply_tokens=256)
        try:
            result = await agent.run_turn("chat: and now?")
        finally:
            await agent.provider.aclose()
        asked = [r for r in server.requests if not r["messages"][0]["content"].startswith("Summarise")]
    assert result.outcome == ev.COMPLETED
    assert len(asked) == 2 and len(asked[1]["messages"]) < len(asked[0]["messages"])
    assert asked[1]["messages"][0]["role"] == "user"  # (no system prompt) whole turns: the window starts with a request
    assert asked[1]["messages"][-1]["content"] == "chat: and now?"
    events = store.events(C, turn=result.turn)
    attempts = [e for e in events if e.type == ev.ASSISTANT_ATTEMPT and e.step == 0]
    assert [(e.attempt, e.body.reason) for e in attempts] == [(0, "error")]
    errors = [e.body for e in events if e.type == ev.REQUEST_ERROR]
    assert errors[0].status == 400 and "maximum context length" in errors[0].message
    assert derive_messages(store, C)[-1] == {"role": "assistant", "content": "Noted."}


@pytest.mark.anyio
async def test_a_refusal_after_the_shorter_request_ends_the_turn_not_the_assistant(store):
    for n in range(4):
        chat_turn(store, n)
    with LoopbackLLM(n_ctx=10) as server:  # nothing fits
        agent = server_agent(store, server, context_tokens=2048, reply_tokens=256, retries=3)
        try:
            first = await agent.run_turn("chat: hello")
            server.n_ctx = None  # the server is given a bigger context: the next turn is answered
            second = await agent.run_turn("chat: hello again")
        finally:
            await agent.provider.aclose()
    assert first.outcome == ev.ERROR
    assert len([e for e in store.events(C, turn=first.turn) if e.type == ev.REQUEST_ERROR]) == 2  # once, then once shorter
    assert second.outcome == ev.COMPLETED


@pytest.mark.anyio
async def test_a_real_model_summarises_what_left_the_window(store):
    for n in range(30):
        chat_turn(store, n)
    with LoopbackLLM() as server:
        agent = server_agent(store, server, context_tokens=1024, reply_tokens=128, system_prompt="Be brief.")
        try:
            result = await agent.run_turn("chat: one more")
            assert not store.events(C, types={ev.CONVERSATION_SUMMARY})  # not on the turn's critical path
            await agent.use_idle_time(result.turn)
            again = await agent.run_turn("chat: and another")
        finally:
            await agent.provider.aclose()
        requests = list(server.requests)
    summaries = store.events(C, types={ev.CONVERSATION_SUMMARY})
    assert len(summaries) == 1 and summaries[0].turn == result.turn
    body = summaries[0].body
    assert body.text == "The person chatted about numbers." and body.first_turn == 1
    assert body.route["provider"] == "openai"
    # The next request carries it, in place of the turns it covers, within the budget.
    last = requests[-1]["messages"] if not requests[-1]["messages"][0]["content"].startswith("Summarise") \
        else requests[-2]["messages"]
    assert "The person chatted about numbers." in last[0]["content"]
    assert not any(f"question {n} " in m.get("content") or "" for m in last for n in range(body.last_turn))
    assert again.outcome == ev.COMPLETED


@pytest.mark.anyio
async def test_the_offline_providers_keep_a_plain_window(store):
    for n in range(30):
        chat_turn(store, n)
    agent, _ = text_agent(store, scripted({"text": "Fine.", "chunk_delay_ms": 0}), context_tokens=1024,
                          reply_tokens=128)
    await agent.run_turn("chat: one more")
    assert not store.events(C, types={ev.CONVERSATION_SUMMARY})
    sent = agent.provider.requests[0].messages
    assert sent[-1]["content"] == "chat: one more" and len(sent) < 2 * 30


@pytest.mark.anyio
async def test_the_models_own_tokenizer_sets_the_count_where_the_server_has_one(tmp_path):
    from timeline import default_config
    from voice.app import open_app

    provider = scripted({"text": "Fine."})

    async def count_tokens(text: str) -> int:  # a tokenizer at 5 characters a token
        return len(text) // 5

    provider.count_tokens = count_tokens
    async with open_app(Settings.from_config(default_config()), db=tmp_path / "events.db", llm=provider, data_dir=tmp_path,
                        recovery=False) as app:
        assert app.loop_settings.count_tokens("x" * 500) == 110  # its rate, and a tenth more
    async with open_app(Settings.from_config(default_config()), db=tmp_path / "events.db", llm=scripted({"text": "Fine."}),
                        data_dir=tmp_path, recovery=False) as app:
        assert app.loop_settings.count_tokens("x" * 500) == estimate_tokens("x" * 500)  # none: the estimate


# -- a small budget, from the outside ------------------------------------------


def summary_requests(server: LoopbackLLM) -> list[str]:
    """The user message of every summary request the server was sent."""
    return [r["messages"][1]["content"] for r in server.requests
            if str(r["messages"][0]["content"]).startswith("Summarise")]


async def talk_with_summaries(store, server: LoopbackLLM, turns: int, **settings) -> None:
    agent = server_agent(store, server, **settings)
    try:
        for n in range(turns):
            result = await agent.run_turn(f"chat: question {n} " + "x" * 60)
            await agent.use_idle_time(result.turn)
    finally:
        await agent.provider.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("context_tokens", [256, 768])
async def test_a_small_budget_never_asks_for_a_summary_of_nothing(store, context_tokens):
    with LoopbackLLM() as server:
        await talk_with_summaries(store, server, 12, context_tokens=context_tokens, reply_tokens=128)
    for content in summary_requests(server):
        lines = content.splitlines()
        assert any(line.startswith(("user: ", "assistant: ")) for line in lines), content


@pytest.mark.anyio
@pytest.mark.parametrize("extra", [0, 1, 2, 3])
async def test_an_early_start_fits_the_budget_and_is_the_turns_own_request(store, extra):
    """Found by the 1,000-turn soak (3,607 tokens against 3,584): a model
    request started early (voice.agent.preempt) took a full window of history
    and then added the person's words on top. Their words count in the
    budget, as in the committed turn's request, which then reads it."""
    import anyio

    from voice.log.window import request_tokens, tools_tokens

    for n in range(40):
        chat_turn(store, n, size=100 + 7 * extra)  # where the window's edge falls moves with the sizes
    words = "chat: and what comes after all of that, in a few more words? " + "z" * 40
    with LoopbackLLM() as server:
        agent = server_agent(store, server, context_tokens=2048, reply_tokens=256)
        try:
            early = agent.start_early(words)
            budget = agent._history_budget(agent.tools.schemas())
            fixed = request_tokens([{"content": agent.settings.system_prompt}])
            assert request_tokens(early.request.messages) - fixed <= budget
            assert request_tokens(early.request.messages) + tools_tokens(early.request.tools) <= 2048 - 256
            async with anyio.create_task_group() as tg:
                tg.start_soon(early.run)
                result = await agent.run_turn(words, early=early)
        finally:
            await agent.provider.aclose()
    assert result.outcome == ev.COMPLETED and early.taken  # the turn's own request: read, not sent again
    assert len(server.requests) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("context_tokens", [768, 1024])
async def test_every_request_the_server_gets_fits_the_budget_summaries_included(store, context_tokens):
    """When summaries had been cancelled for a while (each next request
    cancels one), a summary request carries as many turns as fit: with its
    prompt, the earlier summary and the line breaks that join them, within
    the budget like every other request."""
    from voice.log.window import request_tokens, tools_tokens

    with LoopbackLLM() as server:
        agent = server_agent(store, server, context_tokens=context_tokens, reply_tokens=128)
        try:
            for n in range(40):  # none summarised: each was cancelled by the next request
                await agent.run_turn(f"chat: question {n} " + "x" * 60)
            await agent.use_idle_time(n + 1)
            await talk_with_summaries(store, server, 10, context_tokens=context_tokens, reply_tokens=128)
        finally:
            await agent.provider.aclose()
    assert len(summary_requests(server)) >= 2
    budget = context_tokens - 128
    for r in server.requests:
        assert request_tokens(r["messages"]) + tools_tokens(r.get("tools") or []) <= budget, r["messages"][0]


@pytest.mark.anyio
async def test_a_summary_names_every_turn_it_stands_for_in_history(store, tmp_path):
    import subprocess
    import sys

    with LoopbackLLM() as server:
        await talk_with_summaries(store, server, 16, context_tokens=768, reply_tokens=128)
    summaries = [e.body for e in store.events(C, types={ev.CONVERSATION_SUMMARY})]
    assert len(summaries) >= 2  # a later summary carries the earlier one
    assert all(s.first_turn == 1 for s in summaries), [(s.first_turn, s.last_turn) for s in summaries]
    out = subprocess.run([sys.executable, "-m", "voice", "history", "--db", str(store.path), "--conversation", C],
                         capture_output=True, text=True, timeout=60,
                         env={**__import__("os").environ, "XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert out.returncode == 0, out.stderr
    assert f"(turns 1-{summaries[-1].last_turn})" in out.stdout.splitlines()[0]


# -- the budget's keys, refused alike by every command ------------------------


def voice_with_config(tmp_path, text: str, *args: str) -> "subprocess.CompletedProcess[str]":
    import os
    import subprocess
    import sys

    cfg = tmp_path / "voice.toml"
    cfg.write_text(text)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "XDG_RUNTIME_DIR": str(tmp_path / "run"),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state")}
    return subprocess.run([sys.executable, "-m", "voice", *args, "--config", str(cfg)], capture_output=True,
                          text=True, timeout=120, env=env, input="")


@pytest.mark.parametrize("keys, reply, context", [("reply_tokens = 3000", 3000, 4096),
                                                  ("context_tokens = 1024\nreply_tokens = 600", 600, 1024)])
def test_a_reply_reserve_over_half_the_context_is_refused_by_every_command(tmp_path, keys, reply, context):
    line = f"llm.reply_tokens = {reply} must be at most half of llm.context_tokens = {context}"
    for args in (("config", "show"), ("chat", "--db", str(tmp_path / "events.db"))):
        out = voice_with_config(tmp_path, f"[llm]\n{keys}\n", *args)
        assert out.returncode != 0 and line in out.stderr and len(out.stderr.strip().splitlines()) == 1, out
    doctor = voice_with_config(tmp_path, f"[llm]\n{keys}\n", "doctor", "--no-load")
    assert doctor.returncode == 1
    first = doctor.stdout.splitlines()[0]
    assert first.startswith("[FAIL] config: ") and line in first  # before anything else: no LLM probe line


def test_doctor_warns_when_the_budget_leaves_no_room_for_the_conversation(tmp_path):
    script = tmp_path / "s.toml"
    script.write_text('[[reply]]\ntext = "Hi."\n')
    tiny = voice_with_config(tmp_path, "[llm]\ncontext_tokens = 256\nreply_tokens = 128\n", "doctor", "--no-load",
                             "--llm", f"scripted:{script}")
    (warned,) = [line for line in tiny.stdout.splitlines() if "context budget" in line]
    assert warned.startswith("[warn] context budget: ") and "raise llm.context_tokens" in warned
    roomy = voice_with_config(tmp_path, "", "doctor", "--no-load", "--llm", f"scripted:{script}")
    (fine,) = [line for line in roomy.stdout.splitlines() if "context budget" in line]
    assert fine.startswith("[  ok] context budget: ")
