"""Schemathesis against the OpenAPI document: every operation, generated inputs, a real daemon.

Each answer must match the document (status, content type, schema) and no input may make the
server fail (500). Left out: adding remote servers (a generated stdio command would be run)
and changing the MCP server (a generated host is refused by a rule no schema can state, and a
generated port would move the server); test_rest.py covers those.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import negative_data_rejection, positive_data_acceptance

from chalie.brain.openapi import document
from tests.core.brain.daemon import BrainDaemon

pytestmark = pytest.mark.slow

schema = schemathesis.openapi.from_dict(document()).exclude(
    operation_id=["remote_add", "remote_import", "remote_test", "mcp_server_change"]
)


@schema.parametrize()
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_api_keeps_its_document(case: Any, d: BrainDaemon) -> None:
    # The negative-data check is left out: a query string carries every value as text, and
    # it flags values it generated as another type but that arrive as a valid string
    # (``?tool=%12`` "violating" a string parameter). The refusals it found at first (an
    # empty body, a repeated parameter) are tested in test_rest.py.
    excluded = [negative_data_rejection]
    if case.operation.label == "GET /api/v1/memories/search":
        # A recall needs a query or a location: a rule across two optional parameters that
        # no schema states; its 400 (no-query-or-location) is tested in
        # test_memory_reminders.py.
        excluded.append(positive_data_acceptance)
    case.call_and_validate(
        base_url=d.base,
        headers={"Authorization": f"Bearer {d.token}"},
        timeout=30,
        excluded_checks=excluded,
    )
