"""MCP servers as tool sources (docs/topics/mcp.md): settings
(the config's `[mcp.servers.NAME]`), stdio (the pipe to a local server),
servers (each connection's life), tools (effects and receipts)."""
