"""`voice chat`: the text surface as a REPL.

Ctrl-C (SIGINT) during a reply cancels the turn: exactly the text already
printed becomes the delivered prefix. Ctrl-C at the prompt, or end of input,
exits. Lines are read in a worker thread so the event loop stays free to
stream the reply and to see the signal.
"""

from __future__ import annotations

import signal
import sys
from typing import TextIO

import anyio

from voice.agent.loop import AgentLoop


async def _read_line(stdin: TextIO, prompt: str, out: TextIO) -> str | None:
    if prompt:
        out.write(prompt)
        out.flush()
    line = await anyio.to_thread.run_sync(stdin.readline, abandon_on_cancel=True)
    return line.rstrip("\n") if line else None


async def run_chat(agent: AgentLoop, stdin: TextIO = sys.stdin, out: TextIO = sys.stdout) -> None:
    interactive = stdin.isatty()
    async with anyio.create_task_group() as tg:

        async def on_sigint() -> None:
            with anyio.open_signal_receiver(signal.SIGINT) as signals:
                async for _ in signals:
                    if not agent.cancel():
                        out.write("\n")
                        tg.cancel_scope.cancel()

        tg.start_soon(on_sigint)
        while True:
            line = await _read_line(stdin, "you> " if interactive else "", out)
            if line is None:
                break
            if not line.strip():
                continue
            if not interactive:
                out.write(f"you: {line}\n")
                out.flush()
            await agent.run_turn(line, source="text")
        tg.cancel_scope.cancel()
