"""One MCP server as the config describes it (`[mcp.servers.NAME]`).

The config loader has already checked every key (voice.config_schema,
`check_mcp_servers`) and voice.settings read each table once
(`McpServerSettings`); a `ServerSpec` is that, or an editor's server.
Header values are never held here: a header names the environment
variable its value is read from when the server is connected, so a token
is never in the config, the log or `voice config show`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from voice.settings import McpServerSettings, McpSettings


@dataclass(frozen=True)
class ServerSpec(McpServerSettings):
    """A server to connect: a configured one (its `[mcp.servers.NAME]`
    settings) or one an editor gave (ACP)."""

    given_headers: tuple[tuple[str, str], ...] = ()  # (header, value): an editor's (ACP), never logged
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


def server_specs(mcp: McpSettings) -> list[ServerSpec]:
    """The configured servers, enabled or not, in name order (a stable order
    keeps the tool schemas, and so the request's prefix, the same)."""
    return [ServerSpec(**{f.name: getattr(server, f.name) for f in fields(server)}) for server in mcp.servers]
