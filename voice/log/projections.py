"""Views derived from the log: model history, chat view, trajectory, forks.

Model history comes from the three surface event types only, with
`speech/played` applied so that assistant text is what the person heard.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from voice.log import events as ev
from voice.log.events import Event, blocks_text
from voice.log.store import EventStore, new_conversation_id
from voice.log.window import (
    TokenCounter,
    assistant_entry,
    derive_window,
    estimate_tokens,
)


def message_text(payload: dict[str, Any]) -> str:
    """The text of an assistant message's (or attempt's) payload."""
    return blocks_text(payload.get("content", []))


def _played_by_message(events: list[Event]) -> dict[str, ev.SpeechPlayed]:
    return {e.body.message_id: e.body for e in events if e.type == ev.SPEECH_PLAYED}


@dataclass(frozen=True)
class History:
    """A conversation's model history: `messages` as `derive_messages` gives
    them, and `tool_results`, the structured result behind each "tool"
    message by its tool_call_id (a provider that acts on results reads their
    status and receipt there, never the text rendered for a model)."""

    messages: list[dict[str, Any]]
    tool_results: dict[str, ev.ToolResult] = field(default_factory=dict)


def derive_history(store: EventStore, conversation: str, upto: int | None = None,
                   budget: int | None = None, count: TokenCounter = estimate_tokens,
                   pending: list[dict[str, Any]] | None = None) -> History:
    """See `derive_messages`; `pending` as in `derive_window`."""
    window = derive_window(store, conversation, budget, upto=upto, count=count, pending=pending)
    return History(window.messages, window.tool_results)


def derive_messages(store: EventStore, conversation: str, upto: int | None = None,
                    budget: int | None = None) -> list[dict[str, Any]]:
    """The model history of a conversation (up to and including turn `upto`):
    a list of {"role", "content", "interrupted"?, "tool_calls"?, "tool_call_id"?}.
    When the model has summarised older turns, their summary comes first
    (a system message with "summary": [first, last] turn) in their place;
    with a `budget` (tokens), only the newest whole turns that fit follow it
    (voice.log.window)."""
    return derive_history(store, conversation, upto, budget).messages


@dataclass(frozen=True)
class TurnReply:
    user_text: str
    generated_text: str  # everything the model streamed as text in kept attempts
    delivered_text: str  # what reached the person (and model history)
    interrupted: bool
    outcome: str | None


def turn_reply(store: EventStore, conversation: str, turn: int) -> TurnReply:
    events = store.events(conversation, turn=turn)
    played = _played_by_message(events)
    user = next((e.body.content for e in events if e.type == ev.USER_MESSAGE), "")
    generated, delivered, interrupted, outcome = [], [], False, None
    for e in events:
        if e.type == ev.ASSISTANT_MESSAGE:
            message = e.body
            generated.append("".join(d for _, kind, d in message.stream or [] if kind == "text").strip())
            msg = assistant_entry(message, played)
            if msg is not None and msg["content"].strip():
                delivered.append(msg["content"].strip())
            interrupted = interrupted or bool(msg and msg.get("interrupted"))
        elif e.type == ev.ASSISTANT_ATTEMPT and e.body.reason == "aborted":
            interrupted = True
        elif e.type == ev.TURN_END:
            outcome = e.body.outcome
    return TurnReply(user, " ".join(g for g in generated if g), " ".join(delivered), interrupted, outcome)


def message_line(m: dict[str, Any]) -> str:
    """One history message as a line for people: `role: content [stopped] -> tool(args)`."""
    flag = " [stopped]" if m.get("interrupted") else ""
    calls = "".join(f" -> {c['function']['name']}({c['function']['arguments']})" for c in m.get("tool_calls", []))
    return f"{m['role']}: {m['content']}{flag}{calls}"


def provider_messages(history: list[dict[str, Any]], system_prompt: str | None) -> list[dict[str, Any]]:
    """History as an OpenAI-style request: our bookkeeping keys removed. A
    summary of older turns joins the system prompt (one system message:
    some chat templates refuse a second)."""
    system = [system_prompt] if system_prompt else []
    out = []
    for m in history:
        if "summary" in m:
            system.append(m["content"])
            continue
        out.append({k: v for k, v in m.items() if k != "interrupted"})
    return ([{"role": "system", "content": "\n\n".join(system)}] if system else []) + out


# -- chat view ---------------------------------------------------------------


def chat_view(store: EventStore, conversation: str) -> list[str]:
    """What the conversation looked like to the person, a line per message.
    Interrupted assistant messages end with "[stopped]"."""
    events = store.events(conversation)
    played = _played_by_message(events)
    lines = []
    for e in events:
        if e.type == ev.USER_MESSAGE:
            lines.append(f"you: {e.body.content}")
        elif e.type == ev.USER_STOP and e.body.intent == "sound":
            lines.append("  (a sound stopped the reply)")
        elif e.type == ev.USER_STOP:
            lines.append(f"you: {e.body.content}  ({e.body.intent}: not answered)")
        elif e.type == ev.ASSISTANT_MESSAGE:
            message = e.body
            for block in message.content:
                if block.get("type") == "reasoning":
                    lines.append(f"  (thinking) {block['text'].strip()}")
            msg = assistant_entry(message, played)
            if msg is not None and (msg["content"].strip() or msg.get("interrupted")):
                stopped = " [stopped]" if msg.get("interrupted") else ""
                lines.append(f"assistant: {msg['content'].strip()}{stopped}")
            elif msg is None and message.interrupted:
                lines.append("assistant: [stopped]")
        elif e.type == ev.TOOL_RESULT:
            lines.append(f"  · {e.body.name or '?'} -> {e.body.status}")
        elif e.type == ev.TIMER_FIRED:
            lines.append(f"  [timer] {e.body.text}")
        elif e.type == ev.TURN_END and e.body.outcome == ev.ERROR:
            lines.append(f"  [error: {e.body.error or ''}]")
    return lines


# -- trajectory view -----------------------------------------------------------


@dataclass
class RequestRecord:
    """One provider request of a turn and what became of it."""

    step: int
    attempt: int
    provider: str = ""
    model: str = ""
    lifecycle: list[str] = field(default_factory=list)
    outcome: str = "streaming"  # result | interrupted | error | aborted
    result_seq: int | None = None
    error: str | None = None
    tool_calls: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


# The events that say something of a request (a tool call or a receipt of
# its step adds nothing to its record).
_TRAJECTORY_TYPES = frozenset({ev.STEP_START, ev.STEP_END, ev.ASSISTANT_STREAM, ev.ASSISTANT_MESSAGE,
                               ev.ASSISTANT_ATTEMPT, ev.REQUEST_ERROR, ev.TOOL_RESULT, ev.SPEECH_PLAYED,
                               ev.CONVERSATION_SUMMARY})


def trajectory(store: EventStore, conversation: str, turn: int) -> tuple[list[RequestRecord], str | None]:
    """Each provider request of a turn with its lifecycle, and the turn's outcome."""
    records: dict[tuple[int, int], RequestRecord] = {}
    outcome = None
    cut_by = "stopped"  # what ended a reply's speech early: the person, or the sound card going (audio/lost)
    for e in store.events(conversation, turn=turn):
        if e.type == ev.TURN_END:
            outcome = e.body.outcome
        if e.type == ev.AUDIO_LOST:
            cut_by = "cut: the audio device was lost"
        if e.step is None or e.attempt is None:
            continue
        rec = records.setdefault((e.step, e.attempt), RequestRecord(e.step, e.attempt))
        if e.type not in _TRAJECTORY_TYPES:
            continue
        body = e.body
        route = getattr(body, "route", None)
        if route:
            rec.provider, rec.model = route.get("provider", ""), route.get("model", "")
        if isinstance(body, ev.AssistantStream) and body.frame == "start":
            rec.lifecycle.append("streaming")
        elif isinstance(body, ev.AssistantMessage):
            rec.outcome = "interrupted" if body.interrupted else "result"
            rec.result_seq = e.seq
            rec.tool_calls = [c["function"]["name"] for c in body.tool_calls or []]
            if rec.tool_calls:
                rec.lifecycle.append("tool calls: " + ", ".join(rec.tool_calls))
            rec.lifecycle.append(rec.outcome)
        elif isinstance(body, ev.AssistantAttempt):
            rec.outcome = body.reason or "attempt"
            rec.result_seq = e.seq
            rec.lifecycle.append(f"attempt ({rec.outcome})")
        elif isinstance(body, ev.RequestError):
            rec.outcome, rec.error = "error", body.message
            rec.lifecycle.append(f"error: {rec.error}")
        elif isinstance(body, ev.ToolResult):
            rec.lifecycle.append(f"tool {body.name}: {body.status}")
        elif isinstance(body, ev.ConversationSummary):
            rec.outcome, rec.result_seq = "summary", e.seq
            rec.lifecycle.append(f"summary of turns {body.first_turn}-{body.last_turn}: {body.text}")
        elif isinstance(body, ev.SpeechPlayed) and not body.complete:
            rec.lifecycle.append(f"played {body.words} words, then {cut_by}")
    return [records[k] for k in sorted(records)], outcome


def format_trajectory(turn: int, records: list[RequestRecord], outcome: str | None) -> str:
    lines = [f"turn {turn}: {outcome or 'open'}"]
    for r in records:
        seq = f" (seq {r.result_seq})" if r.result_seq is not None else ""
        lines.append(f"  step {r.step} attempt {r.attempt} [{r.provider}/{r.model}] " + " -> ".join(r.lifecycle) + seq)
    return "\n".join(lines)


# -- forks -------------------------------------------------------------------


def fork(store: EventStore, conversation: str, turn: int) -> str:
    """A new conversation whose log (and so its history) equals the
    original's up to and including `turn`."""
    events = store.events(conversation)
    if not any(e.turn == turn for e in events):
        raise ValueError(f"turn {turn} is not in conversation {conversation}")
    keep = [e for e in events if e.turn is not None and e.turn <= turn]
    ev.check_readable(keep)  # a damaged row is never copied into the fork
    new = new_conversation_id()
    store.copy_events(keep, new)
    store.record(new, ev.ConversationFork(parent=conversation, turn=turn))
    return new
