"""find_skills: pull step-by-step playbooks for a complex task, as their full text.

The same discovery cascade as find_tools, over the skill playbooks (the ones
shipped in ``abilities/skills`` and the user's ``<home>/skills``). Always
available and internal; nothing is injected into the turn.
"""

from __future__ import annotations

from abilities.find_tools import FindToolsParams, run_find
from chalie.ability import Ability
from chalie.discovery.cascade import FindResult
from chalie.result import ToolResult


class FindSkills(Ability):
    name = "find_skills"
    summary = (
        "Pulls step-by-step playbooks for a complex task (planning a trip, scheduling across "
        "time zones, researching a question, recovering from tool errors). Pass one entry per "
        "task, a playbook name or a description; each match comes back with its full text."
    )
    tooltip = "Find step-by-step playbooks"
    examples = (
        "how should I approach planning a trip",
        "is there a playbook for scheduling a meeting across time zones",
        "steps for researching a question properly",
        "what to do when a tool call fails",
        "find a guide for this multi-step task",
        "get the playbook for research",
    )
    Params = FindToolsParams
    internal = True
    discoverable = False
    timeout = 30.0

    def run(self, params: FindToolsParams) -> ToolResult:
        outcome = run_find(self, list(params.query), skills=True)
        if isinstance(outcome, ToolResult):
            return outcome
        assert isinstance(outcome, tuple)
        result, skills = outcome
        assert isinstance(result, FindResult)
        texts = {s.name: s.text for s in skills}
        body = {
            "injected": [
                {"name": d.name, "summary": d.summary, "text": texts.get(d.name, "")}
                for d in result.injected
            ],
            "not_found": result.not_found,
        }
        return ToolResult.success(
            body, meta={"injected": len(result.injected), "not_found": len(result.not_found)}
        )
