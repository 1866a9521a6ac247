"""Proxy names: ``_mcp_<server>_<tool>``, defined once, valid for every model provider.

Rules (the only place they live):

1. A server slug is ``[a-z][a-z0-9]{0,23}``: no underscores, so the server
   part of a proxy name is unambiguous (``_mcp_<slug>_`` is a prefix).
2. The tool part is the remote name in snake case: camelCase is split, every
   run of characters outside ``[a-z0-9]`` becomes one ``_``.
3. A name longer than :data:`MAX_NAME` is cut and ends with ``_`` + the first
   8 hex digits of the remote name's sha256 (short and stable).
4. A name another remote tool already holds gets the same hashed form (a
   stable alias); the mapping is persisted by the store, so a proxy's name
   never changes while its remote tool exists.

Every other module reaches these names through the functions here: the prefix is
written nowhere else (tests/core/test_one_place.py checks it).

Every name made here matches ``^[a-zA-Z0-9_-]{1,64}$`` (the providers' rule)
and the envelope's and the policy's tool-name rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

PREFIX: Final = "_mcp_"
MAX_NAME: Final = 64
_SLUG: Final = r"[a-z][a-z0-9]{0,23}"
SLUG: Final = re.compile(rf"^{_SLUG}$")
# The policy's entry for every tool of one server: ``_mcp_<server>_*`` (its slug in group 1).
SERVER_WILDCARD: Final = re.compile(rf"^{PREFIX}({_SLUG})_\*$")
PROVIDER_NAME: Final = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
HASH_LEN: Final = 8
_CAMEL: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NOT_WORD: Final = re.compile(r"[^a-z0-9]+")


class BadSlug(ValueError):
    """A server name that cannot be a slug; the message says what is allowed."""


def check_slug(name: object) -> str:
    """The slug itself, or BadSlug naming the rule."""
    if not isinstance(name, str) or not SLUG.match(name):
        shown = str(name)[:40]
        raise BadSlug(
            f"server name {shown!r} is not a valid slug: use 1-24 lowercase letters and digits, "
            "starting with a letter (no '_' or '-')"
        )
    return name


def slugify(raw: str) -> str:
    """A slug made from a free-form label (``task-tracker`` → ``tasktracker``); BadSlug if empty."""
    text = _NOT_WORD.sub("", str(raw).lower())
    text = text.lstrip("0123456789")[:24]
    return check_slug(text)


def tool_part(remote: str) -> str:
    """The remote tool name in snake case with only ``[a-z0-9_]``; ``tool`` when nothing is left."""
    text = _CAMEL.sub("_", remote[:512]).lower()
    text = _NOT_WORD.sub("_", text).strip("_")
    return text or "tool"


def short_hash(remote: str) -> str:
    import hashlib  # here: the CLI reads PREFIX on every trail row and rarely hashes

    return hashlib.sha256(remote.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_LEN]


def _hashed(prefix: str, part: str, remote: str, salt: int = 0) -> str:
    digest = short_hash(remote if not salt else f"{remote}\x00{salt}")
    room = MAX_NAME - len(prefix) - 1 - HASH_LEN
    cut = part[:room].rstrip("_") if room > 0 else ""
    return f"{prefix}{cut}_{digest}" if cut else f"{prefix}{digest}"


def proxy_name(server: str, remote: str, taken: Mapping[str, str] | None = None) -> str:
    """The proxy name for ``remote`` on ``server``.

    ``taken`` maps proxy names already assigned (on any server) to the remote
    key that holds them (``server/remote``); a name held by another key is not
    reused, the stable alias is used instead.
    """
    check_slug(server)
    taken = taken or {}
    key = f"{server}/{remote}"
    prefix = server_prefix(server)
    part = tool_part(remote)
    name = prefix + part
    if len(name) > MAX_NAME:
        name = _hashed(prefix, part, remote)
    salt = 0
    while taken.get(name, key) != key:
        salt += 1
        name = _hashed(prefix, part, remote, salt - 1)
    return name


def is_proxy_name(name: str) -> bool:
    """Whether ``name`` has a remote tool's form (its server may not be connected yet)."""
    return name.startswith(PREFIX)


def server_prefix(server: str) -> str:
    """What every proxy name of ``server`` starts with: ``_mcp_<server>_``."""
    return f"{PREFIX}{server}_"


def server_wildcard(server: str) -> str:
    """The policy entry that covers every tool of ``server``: ``_mcp_<server>_*``."""
    return f"{server_prefix(server)}*"


def server_tool(server: str) -> str:
    """The tool a server's own request (sampling, elicitation) is gated as: ``_mcp_<server>``."""
    return f"{PREFIX}{server}"


def server_permission(server: str, what: str) -> str:
    """The gate's permission for a server's own request: ``_mcp_<server>.<what>``."""
    return f"{server_tool(server)}.{what}"


def server_of(name: str) -> str | None:
    """The server slug of a proxy name, or None for any other name."""
    if not name.startswith(PREFIX):
        return None
    slug, sep, _ = name[len(PREFIX) :].partition("_")
    return slug if sep and SLUG.match(slug) else None


# The kinds of a server's own proxies (chalie.mcp.extras).
RESOURCES: Final = "resources"
PROMPTS: Final = "prompts"


def extra_name(server: str, kind: str) -> str:
    """A server's own proxy for its resources or prompts: ``_mcp_<server>__<kind>``.

    The double underscore never comes out of :func:`tool_part`, so no remote tool takes it."""
    return f"{PREFIX}{server}__{kind}"
