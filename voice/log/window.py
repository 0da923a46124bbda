"""The context window: what of a conversation a model request carries.

A request is the system prompt, then the conversation's latest
`conversation/summary` (when the model has summarised older turns), then
the newest WHOLE turns that fit the budget. A turn leaves the window whole
or not at all, so a tool call never goes without its result and an
interrupted reply never loses its marker.

Reading costs the window, not the conversation: turns are read newest first
(the log's index of turn starts), a batch at a time, until the budget is
spent (docs/topics/context-budget.md).

Tokens are counted by a `TokenCounter`: the model's own tokenizer when the
server offers one, else `estimate_tokens` (see there).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from voice.log import events as ev
from voice.log.store import EventStore

TokenCounter = Callable[[str], int]

# Every message costs its role and separators on top of its text: ChatML
# adds "<|im_start|>role\n" and "<|im_end|>\n", about 4 tokens.
MESSAGE_OVERHEAD = 4
_BATCH = 16  # turns read per query, newest first

# The least a request should leave for the conversation: a summary and about two everyday
# exchanges (voice doctor and the start-up check warn below it).
MIN_HISTORY_TOKENS = 300


def estimate_tokens(text: str) -> int:
    """Tokens of `text` without a tokenizer: one per 3 characters, rounded
    up. Measured against SmolLM2's tokenizer (benchmarks/token_estimate.py):
    the person's utterances run 4.0 characters a token, the assistant's
    replies 4.2, the system prompt 4.8, the tool schemas 3.9 (the estimate
    is 1.3-1.6 x the real count there), short JSON tool arguments 2.6 (0.9
    x). So an estimated window errs towards a shorter request, and a server
    that still refuses one gets a request half as long (voice.agent.loop)."""
    return -(-len(text) // 3)


def scaled_estimate(chars_per_token: float) -> TokenCounter:
    """An estimate at a measured rate: the model's own tokenizer counted a
    sample at `chars_per_token` (voice.app.token_counter); a tenth more is
    counted, for text that tokenizes worse than the sample."""
    rate = chars_per_token / 1.1

    def count(text: str) -> int:
        return int(-(-len(text) // rate))

    return count


def message_tokens(message: dict[str, Any], count: TokenCounter = estimate_tokens) -> int:
    """What one history message costs in a request (text, tool calls, overhead)."""
    text = message.get("content") or ""
    for call in message.get("tool_calls", []):
        text += call["function"]["name"] + call["function"]["arguments"]
    return count(text) + MESSAGE_OVERHEAD if text else MESSAGE_OVERHEAD


@dataclass
class Window:
    """The messages of one request (system prompt excluded) and how they came about."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_results: dict[str, ev.ToolResult] = field(default_factory=dict)
    tokens: int = 0  # of `messages`, as counted
    turns: list[int] = field(default_factory=list)  # kept, oldest first
    turn_tokens: list[int] = field(default_factory=list)  # each kept turn's cost, as `turns`
    summary: ev.ConversationSummary | None = None
    dropped: tuple[int, int] | None = None  # (first, last) turn left out, not covered by the summary


@dataclass(frozen=True)
class Anchor:
    """Where a moving window stands (voice.agent.moving_window): the oldest
    turn its requests may carry and the summary they carry before it. Turns
    below `start` stay out even when they would fit: the request's prefix
    stays the same until the window moves."""

    start: int
    summary: ev.ConversationSummary | None


def summary_message(summary: ev.ConversationSummary) -> dict[str, Any]:
    """The summary as history shows it: a system message naming what it replaces."""
    return {"role": "system", "summary": [summary.first_turn, summary.last_turn],
            "content": f"Summary of the earlier conversation (turns {summary.first_turn}-{summary.last_turn}): "
                       f"{summary.text}"}


def latest_summary(store: EventStore, conversation: str, upto: int | None = None) -> ev.ConversationSummary | None:
    event = store.last_of(conversation, {ev.CONVERSATION_SUMMARY})
    if event is None:
        return None
    body = event.body
    if upto is not None and body.last_turn > upto:  # (a history up to an earlier turn: look further back)
        older = [e.body for e in store.events(conversation, types={ev.CONVERSATION_SUMMARY})
                 if e.body.last_turn <= upto]
        return older[-1] if older else None
    return body


def assistant_entry(message: ev.AssistantMessage, played: dict[str, ev.SpeechPlayed]) -> dict[str, Any] | None:
    """An assistant/message as model history sees it: cut to what was heard."""
    text = message.text
    interrupted = message.interrupted
    heard = played.get(message.message_id)
    if heard is not None and not heard.complete:
        text = text[: heard.chars]
        interrupted = True
    calls = message.tool_calls or []
    if not text.strip() and not calls:
        return None  # nothing of it reached the person or the tools
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if interrupted:
        msg["interrupted"] = True
    if calls:
        msg["tool_calls"] = calls
    return msg


def tool_result_text(result: ev.ToolResult) -> str:
    """A tool result as the model reads it: for a write, what its receipt
    proves comes first ("confirmed: ...", never "cancelled")."""
    if result.status == "ok":
        content = result.content
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        return f"{result.receipt}: {text}" if result.receipt else text
    if result.receipt and result.status != ev.BLOCKED:
        return f"{result.receipt}: {result.error or ''}".strip()
    return f"{result.status}: {result.error or result.content or ''}".strip()


def turn_messages(events: list[ev.Event], results: dict[str, ev.ToolResult]) -> list[dict[str, Any]]:
    """One turn's model history, from its surface events and `speech/played`
    (assistant text cut to what was heard)."""
    played = {e.body.message_id: e.body for e in events if e.type == ev.SPEECH_PLAYED}
    out: list[dict[str, Any]] = []
    for e in events:
        body = e.body
        if isinstance(body, ev.UserMessage):
            out.append({"role": "user", "content": body.content})
        elif isinstance(body, ev.AssistantMessage):
            msg = assistant_entry(body, played)
            if msg is not None:
                out.append(msg)
        elif isinstance(body, ev.ToolResult):
            out.append({"role": "tool", "tool_call_id": body.tool_call_id, "content": tool_result_text(body)})
            results[body.tool_call_id] = body
    return out


_READ = ev.SURFACE_TYPES | {ev.SPEECH_PLAYED}


def derive_window(store: EventStore, conversation: str, budget: int | None = None, *, upto: int | None = None,
                  count: TokenCounter = estimate_tokens, pending: list[dict[str, Any]] | None = None,
                  anchor: Anchor | None = None) -> Window:
    """The conversation's model history for a request of at most `budget`
    tokens (None: every turn after the summary). The newest turn is always
    kept, even alone over the budget: it holds the request being answered.
    `pending`: the messages of a turn not yet in the log (an early model
    start's words), the newest turn, chosen as if it were recorded.
    `anchor`: the summary and the oldest turn a moving window carries
    (None: the latest summary and every turn after it that fits)."""
    summary = anchor.summary if anchor is not None else latest_summary(store, conversation, upto)
    window = Window(summary=summary)
    if summary is not None:
        window.messages.append(summary_message(summary))
        window.tokens = message_tokens(window.messages[0], count)
    floor = summary.last_turn if summary is not None else 0
    if anchor is not None:
        floor = max(floor, anchor.start - 1)
    kept: list[tuple[int | None, int, list[dict[str, Any]], dict[str, ev.ToolResult]]] = []  # newest first
    spent = window.tokens
    if pending:
        kept.append((None, 0, pending, {}))
        spent += sum(message_tokens(m, count) for m in pending)
    before = upto + 1 if upto is not None else None
    full = False
    while not full:
        batch = [t for t in store.turns(conversation, before=before, limit=_BATCH) if t > floor]
        if not batch:
            break
        events = store.turn_events(conversation, batch, _READ)
        by_turn: dict[int, list[ev.Event]] = {}
        for e in events:
            by_turn.setdefault(e.turn, []).append(e)
        for turn in batch:  # newest first
            results: dict[str, ev.ToolResult] = {}
            messages = turn_messages(by_turn.get(turn, []), results)
            cost = sum(message_tokens(m, count) for m in messages)
            if budget is not None and kept and spent + cost > budget:
                window.dropped = (_first_turn_after(store, conversation, floor), turn)
                full = True
                break
            kept.append((turn, cost, messages, results))
            spent += cost
        before = batch[-1]
    for turn, cost, messages, results in reversed(kept):
        if turn is not None:
            window.turns.append(turn)
            window.turn_tokens.append(cost)
        window.messages.extend(messages)
        window.tool_results.update(results)
    window.tokens = spent
    return window


def _first_turn_after(store: EventStore, conversation: str, floor: int) -> int:
    """The oldest turn of the conversation above `floor` (where a drop begins)."""
    return store.first_turn(conversation, after=floor) or floor + 1


def request_tokens(messages: list[dict[str, Any]], count: TokenCounter = estimate_tokens) -> int:
    """A whole request's messages (system prompt included), as counted."""
    return sum(message_tokens(m, count) for m in messages)


def tools_tokens(schemas: list[dict[str, Any]], count: TokenCounter = estimate_tokens) -> int:
    """What the tool schemas add to a request (servers render them into the prompt)."""
    return count(json.dumps(schemas, separators=(",", ":"))) if schemas else 0
