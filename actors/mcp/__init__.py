"""MCP both ways: a remote server's connection, their parent, asks, the inbound server."""
