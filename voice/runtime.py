"""What every surface (text chat, voice) starts with: the tools and their
environment from the config, the timer service, and start-up recovery of
the log (close unfinished turns, reconcile unknown writes)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from voice.agent.loop import LoopSettings, ToolEnv
from voice.agent.recovery import recover
from voice.agent.tools import ToolRegistry, default_tools
from voice.agent.tools.timers import TimerService
from voice.errors import UsageError
from voice.log.store import EventStore
from voice.paths import data_dir


def loop_settings(config: dict[str, Any]) -> LoopSettings:
    llm = config["llm"]
    return LoopSettings(system_prompt=llm["system_prompt"], retries=llm["retries"],
                        retry_backoff_s=llm["retry_backoff_s"], max_steps=llm["max_steps"])


def commands_from_config(config: dict[str, Any]) -> dict[str, list[str]]:
    commands = config["tools"]["commands"]
    for name, argv in commands.items():
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise UsageError(f"config: tools.commands.{name} = {argv!r} must be a non-empty list of strings "
                             "(the program and its arguments, no shell)")
    return dict(commands)


def command_environment(config: dict[str, Any], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment of commands the assistant runs: only the variables
    named in `tools.command_env` that are set here (least privilege: no API
    key or token of the daemon's reaches a command, its output or the log)."""
    names = config["tools"]["command_env"]
    bad = [n for n in names if not (isinstance(n, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n))]
    if bad:
        raise UsageError(f"config: tools.command_env = {names!r} must list environment variable names "
                         f"(not {bad[0]!r})")
    return {n: environ[n] for n in names if n in environ}


@dataclass
class Runtime:
    store: EventStore
    tools: ToolRegistry
    env: ToolEnv
    timers: TimerService


def build_runtime(config: dict[str, Any], store: EventStore, announce) -> Runtime:
    commands = commands_from_config(config)
    timers = TimerService(store, announce)
    env = ToolEnv(data_dir=data_dir(), commands=commands, kill_after_s=config["tools"]["kill_after_s"],
                  services={"timers": timers}, command_env=command_environment(config))
    return Runtime(store, default_tools(commands), env, timers)


async def start(runtime: Runtime) -> None:
    report = await recover(runtime.store, runtime.tools, runtime.env)
    if report.closed_turns or report.unknown_writes:
        print(f"recovered: {report.summary()}", file=sys.stderr, flush=True)
