"""The one assembly every entry point starts from: `open_app`.

`voice chat`, `voice run`, `voice replay` and `voice acp` differ only in
the surface they put in front of the assistant (a terminal, a voice
session, an ACP client). Everything behind it is built here, once:

- the event log, opened (and closed on exit);
- the language-model provider, opened and checked (a server that does not
  answer is a UsageError, or with `llm = "auto"` the built-in skills), and
  closed on exit;
- start-up recovery of the log (I10: unfinished turns are closed,
  unknown writes reconciled, nothing re-executed);
- the tools with their environment, and the timer service, which runs
  inside the `async with` and announces through the announcer;
- the sleep watch (voice.agent.sleep_watch), which notices the computer
  waking from sleep and tells the timer service and whoever else listens
  (a voice session reopens its sound card);
- the MCP servers of `[mcp.servers]` (voice.agent.mcp), started together
  and offered as tools; one that does not start costs one line and the
  assistant goes on without it; all of them stopped on the way out;
- the announcer: where the assistant's own messages go (a timer that rings,
  a notice). A surface attaches itself once it exists; what is announced
  before that waits for it.

Invariant: nothing an entry point builds outlives the `async with`: the
timer task lives in the app's task group, the provider and the log are
closed on the way out, also when the body fails or is cancelled.
"""

from __future__ import annotations

import os
import re
import sys
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from voice.agent.approvals import Approvals, Grants
from voice.agent.loop import AgentLoop
from voice.agent.loop_settings import LoopSettings, ToolEnv, ToolServices, history_budget
from voice.agent.mcp.all_servers import McpServers
from voice.agent.mcp.settings import ServerSpec, server_specs
from voice.agent.providers import Hold, open_provider
from voice.agent.providers.base import CountsTokens, Provider
from voice.agent.recovery import recover
from voice.agent.sleep_watch import SleepWatch
from voice.agent.surface import Surface
from voice.agent.timer_service import TimerService
from voice.agent.tools.base import ToolRegistry
from voice.agent.tools import default_tools
from voice.errors import UsageError
from voice.log.late import record_late
from voice.log.store import EventStore, open_store
from voice.log.window import MIN_HISTORY_TOKENS, scaled_estimate
from voice.paths import config_dir
from voice.settings import LlmSettings, Settings, ToolsSettings

Say = Callable[[str], Awaitable[None]]


def loop_settings(llm: LlmSettings) -> LoopSettings:
    # (checked when the config loaded: reply_tokens at most half of context_tokens)
    return LoopSettings(system_prompt=llm.system_prompt, retries=llm.retries, retry_backoff_s=llm.retry_backoff_s,
                        max_steps=llm.max_steps, context_tokens=llm.context_tokens, reply_tokens=llm.reply_tokens,
                        warm_cache=llm.warm_cache)


def command_environment(tools: ToolsSettings, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment of commands the assistant runs: only the variables
    named in `tools.command_env` that are set here (least privilege: no API
    key or token of the daemon's reaches a command, its output or the log)."""
    names = list(tools.command_env)
    bad = [n for n in names if not (isinstance(n, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n))]
    if bad:
        raise UsageError(f"config: tools.command_env = {names!r} must list environment variable names "
                         f"(not {bad[0]!r})")
    return {n: environ[n] for n in names if n in environ}


# A sample of what requests hold, for measuring a model's tokenizer: speech
# as the person says it and replies as the assistant says them.
_TOKEN_SAMPLE = ("What time is it? Set a timer for ten minutes, please. Take a note: buy milk and eggs. "
                 "Sure. The tide turns twice a day, because the moon pulls the sea. It is twenty past three. "
                 "Okay, I saved the note. Your tea timer is done.")


async def token_counter(provider: Provider, settings: LoopSettings, schemas: list[dict[str, Any]]) -> None:
    """Count with the model's own tokenizer where the server offers one:
    the rate it measures on a sample of the system prompt, the tool schemas
    and everyday speech replaces the built-in estimate (voice.log.window)."""
    if not isinstance(provider, CountsTokens):
        return
    import json

    sample = "\n".join([settings.system_prompt, json.dumps(schemas, separators=(",", ":")), _TOKEN_SAMPLE])
    real = await provider.count_tokens(sample)
    if real:
        settings.count_tokens = scaled_estimate(len(sample) / real)


@dataclass
class Announcer:
    """Where the assistant's own messages go (timers, notices). Until a
    surface attaches, they wait (at most `keep`, oldest dropped): a timer
    that came due while the service was down is announced once the voice is
    up, not lost."""

    keep: int = 16
    _target: Say | None = None
    _routed: Callable[[str, str], Awaitable[None]] | None = None  # (conversation, text): a surface per conversation
    _waiting: deque[str] = field(default_factory=deque)

    async def attach(self, target: Say) -> None:
        self._target = target
        while self._waiting:
            await target(self._waiting.popleft())

    async def attach_routed(self, target: Callable[[str, str], Awaitable[None]]) -> None:
        """A surface with one session per conversation (ACP): what belongs to
        a conversation (a timer it set) goes to that conversation's session."""
        self._routed = target
        await self.attach(lambda text: target("", text))

    async def to(self, conversation: str, text: str) -> None:
        """Announce what belongs to `conversation`."""
        if self._routed is not None:
            await self._routed(conversation, text)
        else:
            await self(text)

    def detach(self) -> None:
        self._target = None
        self._routed = None

    async def __call__(self, text: str) -> None:
        if self._target is None:
            self._waiting.append(text)
            while len(self._waiting) > self.keep:
                self._waiting.popleft()
            return
        await self._target(text)


@dataclass
class App:
    """What every surface starts with. Built by `open_app` only."""

    settings: Settings
    store: EventStore
    provider: Provider
    tools: ToolRegistry
    tool_env: ToolEnv
    timers: TimerService
    announcer: Announcer
    loop_settings: LoopSettings
    mcp: McpServers = field(default_factory=lambda: McpServers([]))
    prepared: Any = None  # what open_app's `before_log` made (a voice session's loaded models)
    sleep: SleepWatch = field(default_factory=SleepWatch)  # the computer's sleep, noticed on resume

    @property
    def approvals(self) -> Approvals:
        approvals = self.tool_env.services.approvals
        assert approvals is not None  # open_app always makes them
        return approvals

    def agent(self, surface: Surface, conversation: str, tools: ToolRegistry | None = None) -> AgentLoop:
        """An agent loop on this app's log, provider and tools, answering
        through `surface` in `conversation`."""
        return AgentLoop(self.store, self.provider, surface, conversation, tools or self.tools, self.loop_settings,
                         self.tool_env)


def mcp_servers(specs: list[ServerSpec], store: EventStore, command_env: dict[str, str]) -> McpServers:
    """MCP servers (the config's, or an editor's for its session); a result
    that comes after its call was cancelled is logged `late/output` and goes
    no further."""

    if not specs:
        return McpServers([])  # the MCP SDK is imported only for a server to run (voice.agent.mcp.all_servers)
    from voice.agent.mcp.servers import LateResult, McpServer

    def late(result: LateResult) -> None:
        record_late(store, result.conversation, "mcp-result", tool_call_id=result.tool_call_id,
                    server=result.server, error=result.error, turn=result.turn)

    return McpServers([McpServer(spec, command_env=command_env, environ=os.environ, on_late=late) for spec in specs])


@asynccontextmanager
async def open_app(settings: Settings, *, db: str | Path | None = None,
                   store: EventStore | None = None, llm: str | Provider | None = None,
                   notice: Callable[[str], None] = lambda text: None, data_dir: Path | None = None,
                   recovery: bool = True, mcp: bool = True, grants: Path | None = None, hold: Hold | None = None,
                   before_log: Callable[[], Awaitable[Any]] | None = None) -> AsyncIterator[App]:
    """Open the assistant behind any surface (see the module docstring).

    `settings`: the config, read. `db` names the log (or `store` is one
    already opened: the app closes it too); `llm` is a provider spec ("auto", "openai", a URL, "scripted:FILE";
    default: the config's) or a provider already built (the app closes it);
    `notice` hears how the provider was chosen (e.g. the skills fallback);
    `data_dir` is where notes go (default: the XDG data folder); `mcp`:
    start the configured MCP servers (a replay does not: recorded results
    stand in for every tool); `grants`: the file of "always" answers
    (default: the config folder's grants.json; a replay keeps its own);
    `hold`: around the provider's network I/O (a replay's clock); `before_log`:
    what must fail before the log is opened (a voice session's models: one
    that cannot load leaves no log behind), its result `App.prepared`."""
    spec = llm if llm is not None else settings.llm.provider
    # The provider first: a bad --llm fails before anything else is opened.
    provider = await open_provider(spec, settings.llm, notice=notice, hold=hold) if isinstance(spec, str) else spec
    app: App | None = None
    try:
        prepared = await before_log() if before_log is not None else None
        store = store if store is not None else open_store(settings.paths, db)
        try:
            commands = {name: list(argv) for name, argv in settings.tools.commands.items()}
            announcer = Announcer()
            sleep = SleepWatch()
            timers = TimerService(store, announcer, sleep=sleep)
            sleep.on_resume(timers.resumed)
            approvals = Approvals(Grants(grants or config_dir() / "grants.json"),
                                  timeout_s=settings.tools.approval_timeout_s)
            env = ToolEnv(data_dir=data_dir or settings.data_dir, commands=commands,
                          kill_after_s=settings.tools.kill_after_s,
                          services=ToolServices(timers=timers, approvals=approvals),
                          command_env=command_environment(settings.tools))
            tools = default_tools(commands, approve=settings.tools.approve,
                                  approve_commands=settings.tools.approve_commands)
            app = App(settings, store, provider, tools, env, timers, announcer, loop_settings(settings.llm),
                      mcp_servers(server_specs(settings.mcp), store, env.command_env) if mcp else McpServers([]),
                      prepared, sleep)
            env.services.mcp = app.mcp  # (status: each server's state)
            async with anyio.create_task_group() as tg:
                await tg.start(app.mcp.run)
                for tool in app.mcp.tools():  # in a fixed order: the request's prefix stays the same
                    app.tools.add(tool)
                for line in app.mcp.warnings():
                    notice(line)
                for line in app.mcp.not_started():  # one line each, where the person is (spoken, printed, sent)
                    await announcer(line)
                await token_counter(provider, app.loop_settings, app.tools.schemas())
                left = history_budget(app.loop_settings, app.tools.schemas())
                if app.mcp.servers and left < MIN_HISTORY_TOKENS:
                    notice(f"mcp: the tool schemas leave {left} tokens of llm.context_tokens = "
                           f"{app.loop_settings.context_tokens} for the conversation: offer fewer tools "
                           "(mcp.servers.NAME.allow or deny), or raise llm.context_tokens")
                if recovery:
                    report = await recover(store, app.tools, env)
                    if report.closed_turns or report.unknown_writes:
                        print(f"recovered: {report.summary()}", file=sys.stderr, flush=True)
                tg.start_soon(timers.run)
                tg.start_soon(sleep.run)
                yield app
                tg.cancel_scope.cancel()
        finally:
            store.close()
    finally:
        with anyio.CancelScope(shield=True):
            await (app.provider if app is not None else provider).aclose()
