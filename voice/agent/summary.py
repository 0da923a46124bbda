"""Summaries of the turns that left the context window.

When a conversation outgrows the budget (voice.log.window), the turns that
no longer fit are summarised by the language model, in a request of their
own, after a turn has ended (off the turn's critical path), and recorded as
`conversation/summary` under that turn, so `voice trace TURN` shows the
request and `voice fork` carries it. Later requests carry the summary in
their place.

Only a real language model summarises (an OpenAI-compatible server): the
offline skills provider and a scripted one cannot, and their requests are
a plain window of the newest turns.

Hysteresis: a summary covers the older turns down to half the budget, so
the next one is due only after about half a budget of new conversation, not
at every turn. A failed summary request is recorded as an
`assistant/attempt` (reason error) and tried again after the next turn.
"""

from __future__ import annotations

from typing import Any

import anyio

from voice.agent import turn_rows as rows
from voice.agent.turn_rows import Place
from voice.agent.providers.base import ModelRequest, Provider, ProviderError, TextDelta
from voice.log import events as ev
from voice.log.projections import message_line
from voice.log.store import EventStore
from voice.log.window import (TokenCounter, derive_window, estimate_tokens, latest_summary, request_tokens,
                               turn_messages)

PROMPT = ("Summarise the conversation below between a person and their voice assistant in at most five short "
          "sentences: what was asked, what was answered or done (notes taken, timers set), and anything the "
          "person said about themselves or wants remembered. Plain sentences, no lists.")
SUMMARY_STEP = 1000  # the step number a summary request is recorded under (a turn's own steps are below it)


def summarizes(provider: Provider) -> bool:
    """Whether this provider is a language model that can write summaries."""
    return provider.route.provider == "openai"


def due(store: EventStore, conversation: str, budget: int, count: TokenCounter = estimate_tokens
        ) -> tuple[int, int] | None:
    """The turns (first, last) to summarise now, or None when the window still
    holds everything after the latest summary."""
    if derive_window(store, conversation, budget, count=count).dropped is None:
        return None
    half = derive_window(store, conversation, budget // 2, count=count)
    summary = half.summary
    first = store.first_turn(conversation, after=summary.last_turn if summary else 0)
    last = half.turns[0] - 1 if half.turns else None
    if first is None or last is None or last < first:
        return None
    return first, last


def _request_text(store: EventStore, conversation: str, turns: tuple[int, int], budget: int,
                  count: TokenCounter) -> tuple[str, int] | None:
    """The earlier summary and the turns' messages as lines, newest kept when
    over the budget, and the first turn the new summary stands for (the
    earlier summary's first: it carries it). None when none of the turns'
    lines fits: there is nothing to summarise."""
    previous = latest_summary(store, conversation, upto=turns[0] - 1)
    results: dict[str, ev.ToolResult] = {}
    by_turn: dict[int, list[ev.Event]] = {}
    ids = [t for t in store.turns(conversation, before=turns[1] + 1, limit=1_000_000) if t >= turns[0]]
    for e in store.turn_events(conversation, ids, ev.SURFACE_TYPES | {ev.SPEECH_PLAYED}):
        by_turn.setdefault(e.turn, []).append(e)
    lines: list[str] = []
    for turn in sorted(by_turn):
        lines.extend(message_line(m) for m in turn_messages(by_turn[turn], results))
    head = [f"Earlier summary: {previous.text}"] if previous is not None else []
    # The whole request fits: the prompt, the earlier summary, and each line with the break that joins it.
    kept, spent = [], request_tokens([{"content": PROMPT}, {"content": "\n".join(head)}], count)
    for line in reversed(lines):
        spent += count(line + "\n")
        if spent > budget:
            break
        kept.append(line)
    if not kept:
        return None
    return "\n".join(head + list(reversed(kept))), previous.first_turn if previous is not None else turns[0]


async def summarize(store: EventStore, provider: Provider, conversation: str, turn: int, turns: tuple[int, int],
                    budget: int, count: TokenCounter = estimate_tokens) -> ev.ConversationSummary | None:
    """Ask the model for a summary of `turns` and record it under `turn`.
    Cancellable: a cancelled summary records nothing (the next turn asks again)."""
    route: dict[str, Any] = {"provider": provider.route.provider, "model": provider.route.model,
                             "base_url": provider.route.base_url}
    asked = _request_text(store, conversation, turns, budget, count)
    if asked is None:
        return None  # (a budget too small for even one line of the turns: never ask for a summary of nothing)
    content, first_turn = asked
    request = ModelRequest(messages=[{"role": "system", "content": PROMPT}, {"role": "user", "content": content}])
    text: list[str] = []
    stream = provider.stream(request)
    try:
        async for delta in stream:
            if isinstance(delta, TextDelta):
                text.append(delta.text)
    except ProviderError as exc:
        at = Place(conversation, turn, SUMMARY_STEP, 0)
        rows.attempt(store, at, "error", message_id=f"summary_{turn}", content=[], route=route)
        rows.request_failed(store, at, str(exc), exc.status, exc.retryable)
        return None
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            await stream.aclose()
    summary = " ".join("".join(text).split())
    if not summary:
        return None
    body = ev.ConversationSummary(text=summary, first_turn=first_turn, last_turn=turns[1], route=route)
    store.record(conversation, body, turn=turn, step=SUMMARY_STEP, attempt=0)
    return body
