"""An MCP server's tools as this program's `Tool`s: what each may do, and
what its result proves.

Effects are classified the way the MCP specification says a client must
(tools.mdx, schema `ToolAnnotations`): annotations are hints, those of an
untrusted server are not to be believed, and an absent hint means the worst
case (readOnlyHint false, destructiveHint true, idempotentHint false). So a
tool is a `read` only when the person listed it in `read_tools`, or its
server is trusted (`trust_annotations = true`) and says `readOnlyHint:
true`. Everything else is a write: it needs a receipt, is never replayed
while its outcome is unknown, and asks first when the server's `approve`
policy says so. Home Assistant's tools carry no annotations (and its
`HassTurnOff` unlocks a lock): writes, destructive.

What a write's result proves (its receipt):
- a result: confirmed; `isError`: failed, with the server's text;
- the server refused the request itself (unknown tool, invalid
  arguments): failed, nothing ran;
- anything after the request was sent and before a result (the call was
  cancelled, timed out, the server died or sent something the SDK could
  not accept, such as structured output that breaks its own schema):
  unknown, never replayed.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Protocol

import mcp_types
from mcp.shared.exceptions import MCPError

from voice.agent.approvals import needs_approval
from voice.agent.mcp.settings import ServerSpec
from voice.agent.tools.base import Receipt, Tool, ToolContext, ToolError, ToolOutcome

SEPARATOR = "__"  # the model sees SERVER__TOOL: unique across servers and the built-in tools
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
# The server answered the request with these protocol errors: it was refused before the tool ran.
_REFUSED = (mcp_types.METHOD_NOT_FOUND, mcp_types.INVALID_PARAMS)


class McpCallError(Exception):
    """The call was sent and no result came that proves what it did."""


def model_name(server: str, tool: str) -> str:
    """SERVER__TOOL as providers accept it (letters, digits, _ and -, at most
    64). When that is not the tool's name exactly (a character replaced, the
    name cut), a hash of the real name is added, so two tools never share
    one: a grant or a call meant for one can never reach the other."""
    plain = server + SEPARATOR + tool
    if _NAME_CHARS.search(tool) is None and len(plain) <= 64:
        return plain
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    return (server + SEPARATOR + _NAME_CHARS.sub("_", tool))[:55] + "_" + digest


class ToolServer(Protocol):
    """What a tool needs of its server (an `McpServer`, voice.agent.mcp.servers,
    which makes the tools: a protocol, so this module need not import it)."""

    spec: ServerSpec

    async def call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> mcp_types.CallToolResult: ...

    def unavailable(self) -> str | None: ...


def classify(server: ToolServer, tool: mcp_types.Tool) -> tuple[str, bool]:
    """(read | write, destructive) for one of `server`'s tools."""
    spec = server.spec
    if tool.name in spec.read_tools:
        return "read", False
    hints = tool.annotations if spec.trust_annotations else None
    if hints is not None and hints.read_only_hint is True:
        return "read", False
    destructive = True if hints is None or hints.destructive_hint is None else hints.destructive_hint
    return "write", destructive


def title(server: ToolServer, tool: mcp_types.Tool) -> str:
    """What the person is shown of the tool: its own name, always (a server
    chooses its titles, and one that is not trusted could call `wipe_disk`
    "Read the weather"); a trusted server's title beside it."""
    own = tool.title or (tool.annotations.title if tool.annotations else None)
    if own and server.spec.trust_annotations and own != tool.name:
        return f"{tool.name} ({own})"
    return tool.name


def result_text(result: mcp_types.CallToolResult) -> str:
    """What the model reads of a result: its text parts, then its structured
    content where the text does not already carry it."""
    parts = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(f"[resource {resource.uri}]" + (f"\n{text}" if text else ""))
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource link {block.uri}]")
        else:
            parts.append(f"[{block.type} content, not shown]")
    text = "\n".join(parts)
    if result.structured_content is not None and not text.strip():
        text = json.dumps(result.structured_content, ensure_ascii=False)
    return text


def cut(text: str, limit: int) -> str:
    """A result too large for the context is cut, saying so."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[cut: the result had {len(text)} characters; only the first {limit} are shown]"


def mcp_tool(server: ToolServer, tool: mcp_types.Tool) -> Tool:
    effect, destructive = classify(server, tool)
    spec = server.spec

    async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        try:  # ToolError when the server cannot be reached: nothing was sent
            result = await server.call(tool.name, args, ctx)
        except MCPError as exc:
            if exc.code in _REFUSED:
                raise ToolError(f"the MCP server {spec.name!r} refused the call: {exc.message}") from None
            raise McpCallError(f"the MCP server {spec.name!r} answered with an error after the call was sent "
                               f"({exc.message}); it may or may not have happened") from None
        except RuntimeError as exc:  # the SDK refused the result (e.g. structured output against its schema)
            raise McpCallError(f"the result of {tool.name} from {spec.name!r} could not be accepted ({exc}); "
                               "the call may or may not have happened") from None
        text = cut(result_text(result), spec.max_result_chars)
        if result.is_error:
            if effect == "read":
                raise ToolError(f"{tool.name} failed: {text}")
            return ToolOutcome({"error": text}, Receipt("failed", {"server": spec.name, "is_error": True,
                                                                   "text": text[:500]}))
        if effect == "read":
            return ToolOutcome(text)
        return ToolOutcome(text, Receipt("confirmed", {"server": spec.name, "tool": tool.name}))

    return Tool(name=model_name(spec.name, tool.name), description=tool.description or tool.name,
                parameters=tool.input_schema or {"type": "object"}, effect=effect, run=run,
                timeout_s=spec.timeout_s, destructive=destructive,
                ask_first=needs_approval(spec.approve, effect, destructive),
                source=spec.name, source_id=spec.identity, title=title(server, tool), origin=tool.name,
                unavailable=server.unavailable)

