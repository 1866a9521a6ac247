"""find_skills: pull step-by-step playbooks for a complex task, as their full text.

The same discovery cascade as find_tools, over the skill playbooks (the ones
shipped in ``abilities/skills`` and the user's ``<home>/skills``). Always
available and internal. A playbook that is a connected MCP server's prompt
(``_mcp_<server>_<prompt>``) injects that server's prompts proxy into the turn,
so the model can fill the prompt's arguments; nothing else is injected.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

from chalie.ability import Ability
from chalie.discovery.asking import Entry, ask_discovery, log
from chalie.discovery.cascade import DEFAULT_K, MAX_ENTRIES, FindResult
from chalie.result import ToolResult

Tasks = Annotated[
    list[Entry],
    msgspec.Meta(
        min_length=1,
        max_length=MAX_ENTRIES,
        description="One entry per task you want a playbook for: <the task>.",
    ),
]


class FindSkillsParams(msgspec.Struct, forbid_unknown_fields=True):
    """Read step-by-step playbooks for complex tasks: their text comes back, no tool is added."""

    query: Tasks


class FindSkills(Ability):
    name = "find_skills"
    summary = "Returns step-by-step playbooks for a complex, many-step task."
    tooltip = "Find step-by-step playbooks"
    examples = (
        "how should I approach planning a trip",
        "is there a playbook for scheduling a meeting across time zones",
        "steps for researching a question properly",
        "what to do when a tool call fails",
        "find a guide for this multi-step task",
        "get the playbook for research",
    )
    Params = FindSkillsParams
    aliases = {
        "queries": "query",
        "tasks": "query",
        "task": "query",
        "skills": "query",
        "q": "query",
    }
    internal = True
    discoverable = False
    backgroundable = False
    timeout = 30.0

    def _rules(self, names: list[str]) -> dict[str, list[str]]:
        """The personalisation rules linked to these skills (memories that name them)."""
        desk = getattr(self.services, "memory", None)
        if desk is None or self.context is None or not names:
            return {}
        try:
            found: dict[str, list[str]] = desk.book.rules(desk.readable(self.context), names)
        except Exception:  # rules are extra: a memory fault never hides the playbooks
            log.exception("reading the skill rules failed")
            return {}
        return found

    def _tools_for(self, entries: list[str]) -> list[Any]:
        """The tools these entries match, injected into the turn (nothing on a failure)."""
        if not entries or self.context is None or self.services is None:
            return []
        found = ask_discovery(self, lambda d: d.find(entries, k=DEFAULT_K))
        if isinstance(found, ToolResult) or not found.injected:
            return []
        self.services.turns.inject(self.context.turn_id, found.names)
        return list(found.injected)

    def _tools_named(self, texts: list[str], found: list[Any]) -> list[Any]:
        """The tools a matched playbook names (`web_search`), injected so that the steps it
        gives can be taken (a small model read the playbook and had no tool to follow it)."""
        have = {d.name for d in found} | {"find_tools", "find_skills"}
        named = sorted(
            {n for text in texts for n in re.findall(r"`([a-z][a-z0-9_]{1,63})`", text)} - have
        )
        return [d for d in self._tools_for(named[:MAX_ENTRIES]) if d.name in named]

    def run(self, params: FindSkillsParams) -> ToolResult:
        from chalie.mcp.extras import prompts_proxy_of

        queries = list(params.query)
        outcome: tuple[FindResult, list[Any]] | ToolResult = ask_discovery(
            self, lambda d: d.find_skills(queries, k=DEFAULT_K)
        )
        if isinstance(outcome, ToolResult):
            return outcome
        result, skills = outcome
        texts = {s.name: s.text for s in skills}
        # a connected MCP server's prompt: its prompts proxy becomes callable in this turn
        proxies = sorted({p for s in skills if (p := prompts_proxy_of(s)) is not None})
        if proxies and self.context is not None and self.services is not None:
            self.services.turns.inject(self.context.turn_id, proxies)
        rules = self._rules([d.name for d in result.injected])
        injected: list[dict[str, Any]] = []
        for d in result.injected:
            entry: dict[str, Any] = {
                "name": d.name,
                "summary": d.summary,
                "text": texts.get(d.name, ""),
            }
            if rules.get(d.name):
                # How this person wants it done: preferences and corrections kept as memories.
                entry["rules"] = rules[d.name]
            injected.append(entry)
        body: dict[str, Any] = {"injected": injected, "not_found": result.not_found}
        tools = self._tools_for([str(e["query"]) for e in result.not_found])
        named = self._tools_named([texts.get(d.name, "") for d in result.injected], tools)
        tools += named
        if tools:
            # find_skills taken for find_tools (a small model's slip): the tools its entries
            # match are callable now all the same.
            body["tools"] = [{"name": d.name, "summary": d.summary} for d in tools]
            body["note"] = "No playbook matched; the tools listed can be called in your next step."

        return ToolResult.success(
            body, meta={"injected": len(result.injected), "not_found": len(result.not_found)}
        )
