"""The person's time zone as an ability reads it (kept apart from the personal runtime, which
imports the HTTP clients: the clock and reminders must not load them to be listed)."""

from __future__ import annotations

from typing import Any


def own_zone(services: Any) -> str:
    """The person's time zone (``[accounts] zone``) from an ability's services; UTC where
    the runtime has no personal settings."""
    personal = getattr(services, "personal", None)
    return "UTC" if personal is None else str(personal.settings.zone)
