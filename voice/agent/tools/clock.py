"""get_time: the local date and time (a read)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from voice.agent.tools.base import Tool


async def _get_time(args: dict[str, Any], ctx: object = None) -> dict[str, Any]:
    now = dt.datetime.now().astimezone()
    return {"iso": now.isoformat(timespec="seconds"), "spoken": now.strftime("%-I:%M %p on %A, %B %-d")}


def get_time_tool() -> Tool:
    return Tool(
        name="get_time",
        description="The current local date and time.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
        effect="read",
        run=_get_time,
        timeout_s=2.0,
    )
