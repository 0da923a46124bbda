"""One MCP server as the config describes it (`[mcp.servers.NAME]`).

The config loader has already checked every key (voice.config_schema,
`check_mcp_servers`); this turns a checked table into a `ServerSpec`.
Header values are never held here: a header names the environment
variable its value is read from when the server is connected, so a token
is never in the config, the log or `voice config show`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Approve = Literal["destructive", "writes", "never"]

DEFAULTS: dict[str, Any] = {
    "command": "", "args": [], "env": {}, "cwd": "", "url": "", "headers": {}, "allow": [], "deny": [],
    "trust_annotations": False, "read_tools": [], "timeout_s": 30.0, "approve": "destructive",
    "max_result_chars": 4000, "enabled": True, "start_timeout_s": 10.0,
}


@dataclass(frozen=True)
class ServerSpec:
    name: str
    command: str = ""  # stdio: the program (with `args`)
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # stdio: added to the `tools.command_env` variables
    cwd: str = ""
    url: str = ""  # Streamable HTTP
    headers: tuple[tuple[str, str], ...] = ()  # (header, the environment variable holding its value)
    given_headers: tuple[tuple[str, str], ...] = ()  # (header, value): an editor's (ACP), never logged
    allow: tuple[str, ...] = ()  # offer only these tools (empty: all)
    deny: tuple[str, ...] = ()  # never offer these
    trust_annotations: bool = False  # the server's readOnly/destructive/idempotent hints are believed
    read_tools: tuple[str, ...] = ()  # the person says these only read
    timeout_s: float = 30.0
    approve: Approve = "destructive"
    max_result_chars: int = 4000
    enabled: bool = True
    start_timeout_s: float = 10.0  # the handshake and the tool list (a first `npx` or `uvx` run fetches first)
    # Whose it is: "config" ([mcp.servers]) or "editor" (an ACP client's); an editor's is known for its
    # grants by what it runs, not by the name the editor gave it (`identity`).
    given_by: str = "config"

    @property
    def identity(self) -> str:
        """What "always" answers are kept under: a configured server's name;
        an editor's name with a digest of its command or URL, so another
        program an editor calls by the same name inherits nothing."""
        if self.given_by == "config":
            return self.name
        import hashlib

        what = "\0".join([self.command, *self.args, self.url])
        return f"{self.name}#{hashlib.sha256(what.encode()).hexdigest()[:8]}"

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"

    def offers(self, tool: str) -> bool:
        return (not self.allow or tool in self.allow) and tool not in self.deny

    def unknown_names(self, listed: set[str]) -> list[str]:
        """Lines for names in allow, deny or read_tools that the server does not have."""
        out = []
        for key, names in (("allow", self.allow), ("deny", self.deny), ("read_tools", self.read_tools)):
            missing = [n for n in names if n not in listed]
            if missing:
                out.append(f"mcp.servers.{self.name}.{key} names {', '.join(missing)}, which the server does not "
                           f"have (its tools: {', '.join(sorted(listed)) or 'none'})")
        return out

    def header_values(self, environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
        """The headers to send, and the variables that are not set."""
        values, missing = dict(self.given_headers), []
        for header, variable in self.headers:
            if variable in environ:
                values[header] = environ[variable]
            else:
                missing.append(variable)
        return values, missing


def server_specs(config: dict[str, Any]) -> list[ServerSpec]:
    """The configured servers, enabled or not, in name order (a stable order
    keeps the tool schemas, and so the request's prefix, the same)."""
    out = []
    for name, table in sorted(config.get("mcp", {}).get("servers", {}).items()):
        t = {**DEFAULTS, **table}
        out.append(ServerSpec(
            name=name, command=t["command"], args=tuple(t["args"]), env=tuple(sorted(t["env"].items())),
            cwd=t["cwd"], url=t["url"], headers=tuple(sorted(t["headers"].items())), allow=tuple(t["allow"]),
            deny=tuple(t["deny"]), trust_annotations=t["trust_annotations"], read_tools=tuple(t["read_tools"]),
            timeout_s=float(t["timeout_s"]), approve=t["approve"], max_result_chars=int(t["max_result_chars"]),
            enabled=t["enabled"], start_timeout_s=float(t["start_timeout_s"])))
    return out
