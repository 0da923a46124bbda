"""`session/load`: a conversation from the log, told again as the
`session/update`s an editor shows.

In order, per turn: the person's words (`user_message_chunk`), what of the
reply reached them (`agent_message_chunk`, the delivered prefix: a stopped
reply ends with a " [stopped]" chunk whose `_meta` says so), and each tool
call once, with its final status and what the model saw (`tool_call`:
completed or failed). A summary that stands for older turns comes first as
the agent's thought. Timers that rang in the conversation are told after
the turns (not where they rang). What is not history is not told again: an
attempt that broke off (a provider error) is left out, as the model never
sees it either.
"""

from __future__ import annotations

import json
from typing import Any

from voice.log import events as ev
from voice.log.projections import derive_messages
from voice.log.store import EventStore

STOPPED = " [stopped]"


def history_updates(store: EventStore, conversation: str, titles: dict[str, str]) -> list[Any]:
    """The updates that tell `conversation` again; `titles` maps a tool's
    model name to the title the client was shown (readable names)."""
    from acp import start_tool_call, text_block, tool_content, update_agent_message_text, update_agent_thought_text
    from acp import update_user_message_text

    results = {e.body.tool_call_id: e.body for e in store.events(conversation, types={ev.TOOL_RESULT})}
    out: list[Any] = []
    for message in derive_messages(store, conversation):
        role, content = message["role"], message.get("content") or ""
        if role == "system" and message.get("summary"):
            out.append(update_agent_thought_text(f"(earlier turns, summarised) {content}"))
        elif role == "user" and content:
            out.append(update_user_message_text(content))
        elif role == "assistant":
            if content:
                out.append(update_agent_message_text(content))
            if message.get("interrupted"):
                stopped = update_agent_message_text(STOPPED)
                out.append(stopped.model_copy(update={"field_meta": {"voice": {"interrupted": True}}}))
            for call in message.get("tool_calls") or []:
                result = results.get(call["id"])
                name = call["function"]["name"]
                try:
                    arguments = json.loads(call["function"]["arguments"] or "{}")
                except ValueError:
                    arguments = call["function"]["arguments"]
                ok = result is not None and result.status == "ok" and result.receipt != ev.FAILED
                seen = (result.content if result is not None and result.status == "ok" else
                        {"status": result.status, "error": result.error} if result is not None else None)
                if result is None:
                    seen = {"status": "no result", "error": "the assistant stopped before this call had a result"}
                shown = seen if isinstance(seen, str) else json.dumps(seen, ensure_ascii=False)
                out.append(start_tool_call(call["id"], titles.get(name, name), status="completed" if ok else "failed",
                                           raw_input=arguments, raw_output=seen,
                                           content=[tool_content(text_block(shown))]))
    for e in store.events(conversation, types={ev.TIMER_FIRED}):
        if e.body.text:
            out.append(update_agent_message_text(f"\n[{e.body.text}]\n"))
    return out
