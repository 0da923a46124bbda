"""Summaries of the turns that left the context window.

When the context window moves (voice.agent.moving_window), the turns that
left it are summarised by the language model, in a request of their own,
in idle time after a turn has ended (never on a turn's path: a turn that
comes first goes on without it), and recorded as `conversation/summary`
under that turn, so `voice trace TURN` shows the request and `voice fork`
carries it. Later requests carry the summary in their place.

Only a real language model summarises (an OpenAI-compatible server): the
offline skills provider and a scripted one cannot, and their requests are
a plain window of the newest turns.

The window moves by a large step (down to about half the budget), so a
summary is due only after about half a budget of new conversation, not at
every turn. A failed summary request is recorded as an `assistant/attempt`
(reason error); a failed or cancelled one is asked again at the next move.
"""

from __future__ import annotations

from voice.agent.providers.base import ModelRequest, Provider
from voice.agent.side_requests import SUMMARY_STEP, ask, route_of
from voice.agent.turn_rows import Place
from voice.log import events as ev
from voice.log.projections import message_line
from voice.log.store import EventStore
from voice.log.window import Anchor, TokenCounter, estimate_tokens, latest_summary, request_tokens, turn_messages

PROMPT = ("Summarise the conversation below between a person and their voice assistant in at most five short "
          "sentences: what was asked, what was answered or done (notes taken, timers set), and anything the "
          "person said about themselves or wants remembered. Plain sentences, no lists.")


def summarizes(provider: Provider) -> bool:
    """Whether this provider is a language model that can write summaries."""
    return provider.route.provider == "openai"


def uncovered(store: EventStore, conversation: str, anchor: Anchor) -> tuple[int, int] | None:
    """The turns (first, last) below the window's start that its summary
    does not cover yet: what the next summary is of. None when there are none."""
    covered = anchor.summary.last_turn if anchor.summary is not None else 0
    first = store.first_turn(conversation, after=covered)
    if first is None or first >= anchor.start:
        return None
    return first, anchor.start - 1


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
    asked = _request_text(store, conversation, turns, budget, count)
    if asked is None:
        return None  # (a budget too small for even one line of the turns: never ask for a summary of nothing)
    content, first_turn = asked
    request = ModelRequest(messages=[{"role": "system", "content": PROMPT}, {"role": "user", "content": content}])
    text = await ask(store, provider, Place(conversation, turn, SUMMARY_STEP, 0), request, f"summary_{turn}")
    if text is None:
        return None
    summary = " ".join(text.split())
    if not summary:
        return None
    body = ev.ConversationSummary(text=summary, first_turn=first_turn, last_turn=turns[1], route=route_of(provider))
    store.record(conversation, body, turn=turn, step=SUMMARY_STEP, attempt=0)
    return body
