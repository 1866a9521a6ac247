"""What the small http.server instances of the tests and benchmarks share."""

from __future__ import annotations

# How often a test's http.server checks for shutdown() (serve_forever's poll_interval): its
# 0.5 s default made every test server's teardown take half a second.
SERVER_POLL = 0.02
