"""`voice chat`: the text surface as a REPL.

Ctrl-C (SIGINT) during a reply cancels the turn: exactly the text already
printed becomes the delivered prefix. Ctrl-C at the prompt, or end of input,
exits. Lines are read in a worker thread so the event loop stays free to
stream the reply and to see the signal.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from functools import partial
from concurrent.futures import CancelledError
from typing import TextIO

import anyio
import anyio.abc

from voice.agent.approvals import unanswered
from voice.agent.loop import AgentLoop
from voice.agent.surface import ReadsAnswers
from voice.service.signals import cancel_on_signal
from voice.speech.conversation_policy import ConversationPolicy
from voice.settings import ConversationSettings


def _read_line(stdin: TextIO) -> str:
    """One line ("" at the end). Bytes that are not UTF-8 become U+FFFD: a
    line is never lost to its encoding, and no lone surrogate reaches the
    log. A stream that fails to read counts as ended."""
    raw = getattr(stdin, "buffer", None)
    try:
        return raw.readline().decode("utf-8", "replace") if raw is not None else stdin.readline()
    except (OSError, ValueError):
        return ""


def _start_reader(stdin: TextIO) -> anyio.abc.ObjectReceiveStream[str | None]:
    """Lines from stdin, read by a daemon thread: a blocked read must never
    keep the process alive after the person asked to exit."""
    loop = asyncio.get_running_loop()
    send, receive = anyio.create_memory_object_stream[str | None](1)

    def read() -> None:
        while True:
            line = _read_line(stdin)
            fut = asyncio.run_coroutine_threadsafe(send.send(line.rstrip("\n") if line else None), loop)
            try:
                fut.result()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, RuntimeError, CancelledError):
                return  # the chat is over
            if not line:
                return

    threading.Thread(target=read, name="stdin-reader", daemon=True).start()
    return receive


async def run_chat(agent: AgentLoop, stdin: TextIO = sys.stdin, out: TextIO = sys.stdout, *,
                   idle_gap_s: float | None = None, new_phrases: tuple[str, ...] = (), new_reply: str = "") -> None:
    """The REPL. A conversation ends here as a spoken one does ([conversation]):
    a line made only of a new-conversation phrase ends it (it is not sent to
    the model), and a line after the idle gap opens a new one."""
    interactive = stdin.isatty()
    conversations = ConversationPolicy(agent, agent.store, ConversationSettings(idle_gap_s, new_phrases, new_reply))
    lines = _start_reader(stdin)
    ended = False  # the input ended while a question was asked

    async def read_answer() -> str | None:
        nonlocal ended
        if ended:
            return None  # no one is there to answer: declined at once, not after the timeout
        line = await lines.receive()
        ended = line is None
        if line is not None and not interactive:
            out.write(f"you: {line}\n")
        return line

    if isinstance(agent.surface, ReadsAnswers):  # a question before a call is answered on the next line
        agent.surface.read_answer = read_answer
    async with lines, anyio.create_task_group() as tg:

        def ctrl_c() -> bool:
            """Stop the reply, if one is going; else end the chat."""
            if agent.cancel():
                return False
            out.write("\n")
            return True

        tg.start_soon(partial(cancel_on_signal, tg.cancel_scope, signal.SIGINT, on_signal=ctrl_c))
        expire_s = idle_gap_s if idle_gap_s is not None else 900.0
        resumed = False
        for _, asked in unanswered(agent.store, agent.conversation, expire_s=expire_s):  # a crash left them
            result = await agent.run_turn("", source="text", asked_again=asked)
            tg.start_soon(agent.use_idle_time, result.turn)
            resumed = True
        if not resumed:  # while the first line is typed, the server evaluates the prefix it will begin with
            tg.start_soon(agent.warm_at_start, conversations.idle_s() is not None)
        while True:
            if interactive:
                out.write("you> ")
                out.flush()
            line = None if ended else await lines.receive()
            if line is None:
                break
            if not line.strip():
                continue
            if not interactive:
                out.write(f"you: {line}\n")
                out.flush()
            conversations.end_if_idle()
            if conversations.asks_new(line):
                conversations.switch("asked", words=line.strip())
                if new_reply:
                    await agent.surface.notice(new_reply)
                continue
            result = await agent.run_turn(line, source="text")
            # The reply is out: while the person types, the window's idle work (a summary, warming the
            # server's cache) runs beside the prompt; the next line's turn cancels it, never waits for it.
            tg.start_soon(agent.use_idle_time, result.turn)
        tg.cancel_scope.cancel()
