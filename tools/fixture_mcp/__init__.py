"""MCP servers of our own (mcp SDK) for what the reference servers cannot do on demand."""
