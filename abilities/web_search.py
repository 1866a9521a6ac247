"""web_search: "find out X" on the web, by a delegate that searches, reads and answers with sources.

Discoverable on chat. The work runs as one sub-turn on the ``web-search``
channel (chalie.calls.delegate_ability), whose only tools are the raw ``search``,
``web_fetch`` and ``read``.
"""

from __future__ import annotations

from chalie.calls.delegate_ability import DelegateAbility


class WebSearch(DelegateAbility):
    name = "web_search"
    channel = "web-search"
    summary = (
        "Find something out on the web: a delegate searches, reads the best pages and answers "
        "with its sources (title, URL and the passage used). Give it the question in plain words."
    )
    examples = (
        "search the web for the latest news about this",
        "find out who founded the company",
        "look up the population of Malta",
        "what do reviews say about this laptop",
        "research the question online and cite sources",
        "find articles on the web about this topic",
        "google this for me",
    )
    tooltip = "Search the web and answer with sources"
