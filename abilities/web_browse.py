"""web_browse: work through web pages (follow links, fill a search box, read JS-rendered pages).

Discoverable on chat. The work runs as one sub-turn on the ``web-browse``
channel (chalie.calls.delegate_ability), whose only tools are the raw ``browser``,
``web_fetch`` and ``read``.
"""

from __future__ import annotations

from chalie.calls.delegate_ability import DelegateAbility


class WebBrowse(DelegateAbility):
    name = "web_browse"
    channel = "web-browse"
    summary = (
        "Browse the web in a real browser for a task: open a site, follow links, fill in a "
        "search box, read pages that need JavaScript, take screenshots; answers with sources."
    )
    examples = (
        "go to this website and find the contact page",
        "open the site and search it for the product",
        "follow the links to the pricing page",
        "read this page that needs JavaScript",
        "take a screenshot of the web page",
        "browse the shop and compare the two offers",
    )
    tooltip = "Browse the web"
