"""MCP outbound (client side): remote servers' tools as Chalie proxy abilities.

Pure parts live here (names, connection specs and secrets, the store, the
tool-list diff, result mapping, the proxy classes, the async session); the
actors that own connections live in ``actors/mcp/connections.py``.
"""
