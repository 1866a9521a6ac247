"""The world the real-model benchmark's prompts live in: fixture servers and their facts.

One loopback HTTP server answers as Open-Meteo (forecast and geocoding), as a
SearXNG JSON endpoint and as a small web site; Radicale holds a calendar and an
address book; a throw-away Dovecot with aiosmtpd holds a mailbox and takes
mail (skipped where Dovecot is missing). Dates are relative to the day the
benchmark runs, in :data:`ZONE`, so a prompt like "what's on my calendar
tomorrow" has one right answer on any day.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final
from zoneinfo import ZoneInfo

from tools import personal_servers as servers

ZONE: Final = "Europe/Berlin"
USER: Final = "alice"
PASSWORD: Final = "secret"

GEOCODING: Final = {
    "valletta": ("Valletta", 35.89968, 14.5148, "MT", "Malta", "Europe/Malta"),
    "reykjavik": ("Reykjavík", 64.13548, -21.89541, "IS", "Iceland", "Atlantic/Reykjavik"),
    "lisbon": ("Lisbon", 38.71667, -9.13333, "PT", "Portugal", "Europe/Lisbon"),
}
# Current temperature by latitude band (°C): Reykjavik cold and snowing, the rest mild.
TEMPERATURES: Final = {"valletta": 24.1, "reykjavik": -3.5, "lisbon": 17.2}

PAGES: Final = {
    "/museum": (
        "Grand Harbour Maritime Museum - visiting",
        "The Grand Harbour Maritime Museum is open every day from 9:00 to 17:00, "
        "except on public holidays. Tickets cost 12 euros.",
    ),
    "/regatta": (
        "Valletta Regatta 2026 results",
        "The 2026 Valletta regatta was won by the crew of Team Marsamxett, ahead of "
        "Team Birgu and Team Senglea.",
    ),
    "/menu": (
        "Cafe Cordina - today's menu",
        "Today's soup is a lentil soup with smoked paprika. Main: grilled lampuki with capers.",
    ),
}
SEARCH_RESULTS: Final = {
    "museum": "/museum",
    "harbour": "/museum",
    "regatta": "/regatta",
}


def _page(title: str, text: str) -> bytes:
    return (
        f"<!doctype html><html><head><title>{title}</title></head>"
        f"<body><main><h1>{title}</h1><p>{text}</p></main></body></html>"
    ).encode()


def _forecast(query: dict[str, list[str]]) -> dict[str, Any]:
    lat = float(query["latitude"][0])
    key = min(GEOCODING, key=lambda k: abs(GEOCODING[k][1] - lat))
    temp = TEMPERATURES[key]
    imperial = query.get("temperature_unit", [""])[0] == "fahrenheit"
    if imperial:
        temp = round(temp * 9 / 5 + 32, 1)
    days = int(query.get("forecast_days", ["7"])[0])
    cold = key == "reykjavik"
    today = dt.date.today()
    return {
        "latitude": lat,
        "longitude": float(query["longitude"][0]),
        "timezone": query.get("timezone", ["GMT"])[0],
        "current_units": {"temperature_2m": "°F" if imperial else "°C"},
        "current": {
            "time": dt.datetime.now().strftime("%Y-%m-%dT%H:00"),
            "interval": 900,
            "temperature_2m": temp,
            "relative_humidity_2m": 61,
            "apparent_temperature": round(temp - 1, 1),
            "precipitation": 0.0,
            "weather_code": 71 if cold else 0,
            "wind_speed_10m": 12.3,
            "wind_direction_10m": 290,
            "is_day": 1,
        },
        "daily": {
            "time": [(today + dt.timedelta(days=d)).isoformat() for d in range(days)],
            "weather_code": [71 if cold else 0] * days,
            "temperature_2m_max": [temp + 2] * days,
            "temperature_2m_min": [temp - 4] * days,
            "precipitation_sum": [0.0] * days,
            "precipitation_probability_max": [5] * days,
            "wind_speed_10m_max": [15.1] * days,
        },
    }


@dataclass
class World:
    http: servers.Http
    dav: servers.Radicale | None = None
    imap: Any = None
    smtp: Any = None
    searches: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"{self.http.url}{path}"

    def config(self) -> str:
        """The config.toml sections that point the daemon at this world."""
        port = urllib.parse.urlsplit(self.http.url).port
        return (
            f'[weather]\nforecast_url = "{self.http.url}/v1/forecast"\n'
            f'geocoding_url = "{self.http.url}/v1/search"\n'
            f'[accounts]\nzone = "{ZONE}"\n'
            f'[web]\nallow = ["127.0.0.1:{port}"]\n'
            f'[web.search]\nprovider = "searxng"\nurl = "{self.http.url}"\n'
        )

    def accounts(self) -> list[tuple[list[str], str | None]]:
        """``chalie accounts add`` argument lists (with the password for stdin)."""
        out: list[tuple[list[str], str | None]] = []
        if self.dav is not None:
            url = self.dav.url + "/"
            for kind, name in (("caldav", "work"), ("carddav", "people")):
                out.append(
                    (
                        [kind, name, "--url", url, "--username", USER, "--password-stdin"],
                        PASSWORD,
                    )
                )
        if self.imap is not None and self.smtp is not None:
            for kind, name, port in (
                ("imap", "mail", self.imap.port),
                ("smtp", "out", self.smtp.port),
            ):
                out.append(
                    (
                        [
                            kind,
                            name,
                            "--host",
                            "127.0.0.1",
                            "--port",
                            str(port),
                            "--security",
                            "none",
                            "--username",
                            USER,
                            "--address",
                            "Alice <alice@example.org>",
                            "--password-stdin",
                        ],
                        PASSWORD,
                    )
                )
        return out


def _route(world_searches: list[str]) -> Any:
    def route(
        path: str, query: dict[str, list[str]], headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        if path == "/v1/search":
            name = query.get("name", [""])[0].lower().split(",")[0].strip()
            found = GEOCODING.get(name)
            if found is None:
                return servers.json_answer({"generationtime_ms": 0.4})
            label, lat, lon, code, country, zone = found
            return servers.json_answer(
                {
                    "results": [
                        {
                            "id": 1,
                            "name": label,
                            "latitude": lat,
                            "longitude": lon,
                            "country_code": code,
                            "country": country,
                            "timezone": zone,
                        }
                    ]
                }
            )
        if path == "/v1/forecast":
            return servers.json_answer(_forecast(query))
        if path == "/search":
            q = query.get("q", [""])[0]
            world_searches.append(q)
            base = headers.get("Host", "")
            hits = []
            for word, page in SEARCH_RESULTS.items():
                if word in q.lower():
                    title, text = PAGES[page]
                    hits.append(
                        {"title": title, "url": f"http://{base}{page}", "content": text[:80]}
                    )
            return servers.json_answer({"query": q, "results": hits})
        if path in PAGES:
            return 200, {"Content-Type": "text/html; charset=utf-8"}, _page(*PAGES[path])
        return 404, {"Content-Type": "text/plain"}, b"not found"

    return route


# -- the calendar, the address book and the mailbox ----------------------------------------


def day(offset: int) -> dt.date:
    return dt.datetime.now(ZoneInfo(ZONE)).date() + dt.timedelta(days=offset)


EVENTS: Final = (
    # (uid, title, day offset, hour, minutes, location)
    ("standup", "Team standup", 0, 9, 30, "Room 2"),
    ("dentist", "Dentist appointment", 1, 15, 0, "Dr. Borg, Sliema"),
    ("lunch", "Lunch with Maria", 3, 12, 30, "Cafe Cordina"),
)

CONTACTS: Final = (
    ("maria", "Maria Lopez", "+356 2123 4567", "maria.lopez@example.org", "Cordina Ltd"),
    ("bob", "Bob Smith", "+44 20 7946 0958", "bob.smith@example.org", "Acme"),
)

MAILS: Final = (
    (
        "Bob Smith <bob.smith@example.org>",
        "Quarterly report",
        "Hi Alice, the quarterly report is attached; revenue grew 12 percent. Bob",
    ),
    (
        "Carla Vella <carla@example.org>",
        "Keys",
        "Alice, I left the spare keys under the blue flower pot by the door. Carla",
    ),
    (
        "Newsletter <news@example.org>",
        "Your weekly digest",
        "Ten things to do in Valletta this weekend.",
    ),
)


def _ics(uid: str, title: str, offset: int, hour: int, minute: int, location: str) -> str:
    start = dt.datetime.combine(day(offset), dt.time(hour, minute))
    end = start + dt.timedelta(hours=1)
    f = "%Y%m%dT%H%M%S"
    return (
        "BEGIN:VCALENDAR\nVERSION:2.0\nPRODID:bench\nBEGIN:VEVENT\n"
        f"UID:{uid}@bench\nDTSTAMP:20260101T000000Z\n"
        f"DTSTART;TZID={ZONE}:{start.strftime(f)}\nDTEND;TZID={ZONE}:{end.strftime(f)}\n"
        f"SUMMARY:{title}\nLOCATION:{location}\nEND:VEVENT\nEND:VCALENDAR\n"
    )


def _vcard(uid: str, name: str, phone: str, mail: str, org: str) -> str:
    given, family = name.split(" ", 1)
    return (
        "BEGIN:VCARD\nVERSION:3.0\n"
        f"UID:{uid}\nFN:{name}\nN:{family};{given};;;\nTEL;TYPE=CELL:{phone}\n"
        f"EMAIL;TYPE=INTERNET:{mail}\nORG:{org}\nEND:VCARD\n"
    )


def _mail(sender: str, subject: str, body: str, when: dt.datetime) -> bytes:
    import email.message
    import email.utils

    msg = email.message.EmailMessage()
    msg["From"] = sender
    msg["To"] = "Alice <alice@example.org>"
    msg["Subject"] = subject
    msg["Date"] = email.utils.format_datetime(when)
    msg["Message-ID"] = email.utils.make_msgid(domain="example.org")
    msg.set_content(body)
    return bytes(msg)


@contextlib.contextmanager
def world() -> Iterator[World]:
    searches: list[str] = []
    with contextlib.ExitStack() as stack:
        http = stack.enter_context(servers.http_server(_route(searches)))
        w = World(http, searches=searches)
        try:
            dav = stack.enter_context(servers.radicale({USER: PASSWORD}))
        except Exception as exc:  # Radicale comes with the test extra
            print(f"  (no calendar or contacts: {exc})")
        else:
            cal = servers.make_calendar(dav, USER, "work", "Work")
            for uid, *rest in EVENTS:
                servers.put_object(dav, USER, f"{cal}{uid}.ics", _ics(uid, *rest), "text/calendar")
            book = servers.make_addressbook(dav, USER, "people", "People")
            for uid, *card in CONTACTS:
                servers.put_object(dav, USER, f"{book}{uid}.vcf", _vcard(uid, *card), "text/vcard")
            w.dav = dav
        if servers.have_dovecot():
            imap = stack.enter_context(servers.dovecot({USER: PASSWORD}))
            w.imap = imap
            w.smtp = stack.enter_context(servers.smtp(imap, {USER: PASSWORD}))
            now = dt.datetime.now(dt.UTC)
            for i, (sender, subject, body) in enumerate(MAILS):
                when = now - dt.timedelta(hours=3 * (len(MAILS) - i))
                imap.deliver(USER, _mail(sender, subject, body, when), sender)
        else:
            print("  (no mailbox: dovecot-imapd is not installed)")
        yield w


def dump_facts() -> str:
    return json.dumps({"events": EVENTS, "contacts": CONTACTS, "mails": MAILS}, indent=1)
