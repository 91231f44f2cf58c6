"""The MCP server of `danube-admin serve --mode mcp`."""
