"""run_command: run one of the commands configured in [tools.commands] (a write).

The model only names a command; the argv comes from the configuration, so
nothing else can run. The process runs in its own group and is stopped with
everything it started if the turn is cancelled (see `processes.run_process`);
the cancellation propagates and the loop records the receipt as unknown.

It asks the person first (voice.agent.approvals) as `tools.approve` says,
or the command's own entry in `tools.approve_commands`: by default every
configured command asks, until the person answers "yes, always" (kept
under `tools.commands NAME`, as `voice grants` lists it). The person chose
the command when they configured it, not the moment it runs.

Its environment is only the variables named in `tools.command_env` (PATH,
HOME, the locale, ...), never the daemon's whole environment: an API key
there would otherwise reach the command, its output, the log and the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from voice.agent.approvals import needs_approval
from voice.agent.tools.base import Receipt, Tool, ToolContext, ToolError, ToolOutcome
from voice.agent.tools.processes import run_process

TAIL_CHARS = 2000
GRANT_SOURCE = "tools.commands"  # what a command's "always" is kept under, with its name (no server has a dot)


async def _run_command(args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
    name = args.get("name") if isinstance(args, dict) else None
    allowed = ", ".join(sorted(ctx.commands)) or "none are configured"
    if not isinstance(name, str) or not name:
        raise ToolError(f"run_command needs a command name (a string); allowed: {allowed}")
    if name not in ctx.commands:
        raise ToolError(f"unknown command {name!r}; allowed: {allowed}")
    argv = ctx.commands[name]
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ToolError(f"command {name!r} is misconfigured (its argv must be a non-empty list of strings)")
    argv = list(argv)
    try:
        result = await run_process(argv, kill_after_s=ctx.kill_after_s, env=ctx.command_env)
    except OSError as e:  # raised only when the program could not start: nothing ran
        error = f"{type(e).__name__}: {e}"
        return ToolOutcome(
            content={"name": name, "error": f"could not start: {error}"},
            receipt=Receipt("failed", evidence={"argv": argv, "error": error}),
        )
    ok = result.returncode == 0
    return ToolOutcome(
        content={
            "name": name,
            "exit_status": result.returncode,
            "stdout": result.stdout.decode("utf-8", errors="replace")[-TAIL_CHARS:],
            "stderr": result.stderr.decode("utf-8", errors="replace")[-TAIL_CHARS:],
        },
        receipt=Receipt(
            "confirmed" if ok else "failed",
            evidence={
                "argv": argv,
                "exit_status": result.returncode,
                "pid": result.pid,
                "duration_s": round(result.duration_s, 3),
            },
        ),
        phrase=f"Done, {name} ran." if ok else None,
    )


def run_command_tool(names: Iterable[str] = (), *, approve: str = "writes",
                     approve_commands: Mapping[str, str] | None = None) -> Tool:
    """The tool; `names` (the configured command names, optional) are listed
    in its description and schema so the model knows what it may ask for.
    `approve` is the policy of every command, `approve_commands` a
    command's own (NAME -> policy); a command's effect is not known, so
    "destructive" asks as "writes" does."""
    names = sorted(names)
    policies = {name: (approve_commands or {}).get(name, approve) for name in names}
    asking = {name for name, policy in policies.items() if needs_approval(policy, "write", destructive=True)}

    def asks_for(args: dict[str, Any]) -> tuple[str, str] | None:
        name = args.get("name") if isinstance(args, dict) else None
        # A name that is not configured asks nothing: the tool refuses it, nothing runs.
        return (GRANT_SOURCE, name) if isinstance(name, str) and name in asking else None

    description = (
        "Run one of the commands configured by the user in [tools.commands], by its name. "
        "Only configured commands can run; no other program or command line is possible."
    )
    name_schema: dict[str, Any] = {"type": "string", "description": "The configured command's name."}
    if names:
        description += " Configured: " + ", ".join(names) + "."
        name_schema["enum"] = names
    return Tool(
        name="run_command",
        description=description,
        parameters={
            "type": "object",
            "properties": {"name": name_schema},
            "required": ["name"],
            "additionalProperties": False,
        },
        effect="write",
        run=_run_command,
        timeout_s=30.0,
        destructive=True,  # what a configured command does is not known here
        ask_first=bool(asking),
        asks_for=asks_for,
        title="Run command",
    )
