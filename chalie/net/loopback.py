"""What loopback is, once: this machine, reached without a network.

A host is loopback when it is ``localhost`` or a name under ``.localhost``
(RFC 6761: they resolve to this machine) or an address in ``127.0.0.0/8`` or
``::1`` (an IPv6 address may come bracketed, as in a URL or a Host header).

Every rule that depends on it asks here: whether a server may bind a host
without ``allow_remote`` (the chat WebSocket, the MCP server, the Brain),
which Host headers a local server answers (the DNS-rebinding guard), which
networks a loopback MCP server's sign-in may reach, whether a model server's
URL skips the proxy, whether a mail account without TLS crosses a network.
No other module writes a loopback address or name (tests/core/test_one_place.py
checks it).
"""

from __future__ import annotations

import ipaddress
from typing import Final

# The address a local server binds, and a local URL names, unless told otherwise.
HOST: Final = "127.0.0.1"
# The names a client on this machine reaches a loopback server by (as in a Host header).
NAMES: Final = (HOST, "localhost", "[::1]")
# The loopback networks, as a guard's allow-list.
NETS: Final = ("127.0.0.0/8", "::1")
_LOCALHOST: Final = "localhost"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name, an address, or a bracketed IPv6 address) is this machine."""
    name = host.lower().rstrip(".")
    if name == _LOCALHOST or name.endswith(f".{_LOCALHOST}"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_names(host: str) -> tuple[str, ...]:
    """The host names (without port) a server bound to ``host`` answers in a Host header:
    the loopback names and the bound host itself (an IPv6 address bracketed)."""
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return NAMES if shown in NAMES else (*NAMES, shown)
