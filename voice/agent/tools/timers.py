"""The timer tools: set_timer / cancel_timer / list_timers, on the timer
service the app gives them (voice.agent.timer_service)."""

from __future__ import annotations

from typing import Any

from voice.agent.timer_service import TimerService
from voice.agent.tools.base import Receipt, Tool, ToolContext, ToolError, ToolOutcome
from voice.log import events as ev

MAX_SECONDS = 7 * 24 * 3600


def _service(ctx: ToolContext) -> TimerService:
    service = ctx.timers
    if service is None:
        raise ToolError("timers are not available here")
    return service


async def _set_timer(args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
    seconds = args.get("seconds")
    if isinstance(seconds, float) and seconds.is_integer():
        seconds = int(seconds)
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not 1 <= seconds <= MAX_SECONDS:
        raise ToolError(f"set_timer needs {{\"seconds\": a whole number from 1 to {MAX_SECONDS}}}")
    label = str(args.get("label") or "").strip()
    timer, seq = _service(ctx).set(seconds, label, ctx.conversation, ctx.turn, ctx.tool_call_id)
    return ToolOutcome({"timer_id": timer.timer_id, "seconds": seconds, "label": label},
                       Receipt("confirmed", {"timer_id": timer.timer_id, "due_wall": timer.due_wall, "seq": seq}),
                       phrase=f"Done, your {timer.describe()} is set.")


async def _reconcile_set(args: dict[str, Any], dispatch: dict[str, Any], ctx: ToolContext) -> Receipt:
    service = _service(ctx)
    for e in service.store.events(types={ev.TIMER_SET}):
        if (e.body.tool_call_id, e.conversation, e.turn) == (dispatch.get("tool_call_id"), ctx.conversation, ctx.turn):
            return Receipt("confirmed", {"timer_id": e.body.timer_id, "seq": e.seq})
    return Receipt("failed", {"reason": "no timer/set event for this call"})


async def _cancel_timer(args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
    label = str(args.get("label") or "").strip()
    timer = _service(ctx).cancel(label, ctx.conversation, ctx.turn)
    if timer is None:
        return ToolOutcome({"cancelled": False, "reason": "no such timer is running"},
                           Receipt("failed", {"reason": "no active timer" + (f" named {label}" if label else "")}))
    return ToolOutcome({"cancelled": True, "timer_id": timer.timer_id}, Receipt("confirmed", {"timer_id": timer.timer_id}),
                       phrase="Done, the timer is cancelled.")


async def _list_timers(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    service = _service(ctx)
    now = service.clock()
    return {"timers": [{"label": t.label, "seconds": t.seconds, "remaining_s": max(0, round(t.due_wall - now)),
                        "spoken": t.describe()} for t in service.active()]}


def timer_tools() -> list[Tool]:
    return [
        Tool("set_timer", "Set a timer that announces itself when it is done.",
             {"type": "object", "properties": {"seconds": {"type": "integer", "minimum": 1},
                                               "label": {"type": "string"}}, "required": ["seconds"]},
             "write", _set_timer, timeout_s=5.0, reconcile=_reconcile_set),
        Tool("cancel_timer", "Cancel a running timer (the latest, or the one with this label).",
             {"type": "object", "properties": {"label": {"type": "string"}}}, "write", _cancel_timer, timeout_s=5.0),
        Tool("list_timers", "List the running timers.", {"type": "object", "properties": {}}, "read",
             _list_timers, timeout_s=5.0),
    ]
