"""The web console (`danube-admin serve --mode ui`, issue 26 point 4): a JSON API over the same
command registry as the MCP server (`danube.admin_mcp.tools`) and a static single-page UI."""
