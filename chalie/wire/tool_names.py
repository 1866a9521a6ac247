"""What a tool may be called, and the argument names the framework reserves in every call.

Read by the ability contract (``chalie.ability``), by skills (named like tools), by
remote MCP tools' cleaning and by the CLI; kept apart from the contract so that these
rules cost nothing to import.
"""

from __future__ import annotations

import re
from typing import Final

# A tool's name: lowercase snake case, at most NAME_MAX characters.
NAME_PATTERN: Final = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")
NAME_MAX: Final = 64
# Framework fields injected into every descriptor; no ability may declare them.
FRAMEWORK_FIELDS: Final = ("act_summary", "async")
# What the model reads for act_summary: a placeholder, since small models copy examples.
ACT_SUMMARY_DESCRIPTION: Final = "<what this call does, in a few words>"
