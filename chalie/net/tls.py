"""The one verifying TLS context for every outgoing HTTPS connection (MCP servers, model servers).

Building a context costs 15-70 ms of CPU (it loads the CA bundle); a client
made without one builds its own, on the event loop, at every (re)connect.
Made once, on first use, from httpx2's defaults (the certifi bundle, TLS 1.2+).
"""

from __future__ import annotations

import functools
import ssl

import httpx2


@functools.cache
def tls_context() -> ssl.SSLContext:
    return httpx2.create_ssl_context()
