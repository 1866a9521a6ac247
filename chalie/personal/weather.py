"""Open-Meteo: a place name to coordinates (geocoding API), coordinates to weather (forecast API).

No key. The two base URLs are configuration (``[weather]``), so a mirror or a
self-hosted Open-Meteo works the same. Condition names are the WMO weather
interpretation codes Open-Meteo documents. A failure is an
:class:`AccountFailure` with ``service-unreachable`` (refused, timed out,
5xx, a body that is not Open-Meteo's JSON) or ``unknown-place``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Literal

from chalie.accounts.failure import AccountFailure
from chalie.personal.http import HttpClient

WHO: Final = "open-meteo"
Units = Literal["metric", "imperial"]
# WMO weather interpretation codes (Open-Meteo's documentation, "WMO Weather interpretation codes").
WMO: Final[dict[int, str]] = {
    0: "Clear", 1: "Mainly clear", 2: "Partly cloudy", 3: "Overcast",
    45: "Fog", 48: "Depositing rime fog",
    51: "Light drizzle", 53: "Moderate drizzle", 55: "Dense drizzle",
    56: "Light freezing drizzle", 57: "Dense freezing drizzle",
    61: "Slight rain", 63: "Moderate rain", 65: "Heavy rain",
    66: "Light freezing rain", 67: "Heavy freezing rain",
    71: "Slight snow fall", 73: "Moderate snow fall", 75: "Heavy snow fall", 77: "Snow grains",
    80: "Slight rain showers", 81: "Moderate rain showers", 82: "Violent rain showers",
    85: "Slight snow showers", 86: "Heavy snow showers",
    95: "Thunderstorm", 96: "Thunderstorm with slight hail", 99: "Thunderstorm with heavy hail",
}  # fmt: skip
CURRENT: Final = (
    "temperature_2m,relative_humidity_2m,apparent_temperature,precipitation,weather_code,"
    "wind_speed_10m,wind_direction_10m,is_day"
)
DAILY: Final = (
    "weather_code,temperature_2m_max,temperature_2m_min,precipitation_sum,"
    "precipitation_probability_max,wind_speed_10m_max"
)


@dataclass(frozen=True)
class Place:
    label: str  # "Valletta, MT"
    latitude: float
    longitude: float
    timezone: str = "auto"


def condition(code: Any) -> str:
    return WMO.get(code, f"Unknown (WMO code {code})") if isinstance(code, int) else "Unknown"


class OpenMeteo:
    def __init__(self, forecast_url: str, geocoding_url: str, timeout: float) -> None:
        self.forecast_url = forecast_url
        self.geocoding_url = geocoding_url
        self.http = HttpClient(WHO, timeout=timeout, max_body=4 * 1024 * 1024)

    def close(self) -> None:
        self.http.close()

    def _get(self, url: str, params: dict[str, str]) -> dict[str, Any]:
        try:
            resp = self.http.request("GET", url, params=params, ok=(200, 400))
        except AccountFailure as exc:
            raise AccountFailure(
                "service-unreachable", f"Open-Meteo: {exc.message}", account=WHO
            ) from None
        try:
            data = json.loads(resp.content)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise AccountFailure(
                "service-unreachable", "Open-Meteo answered something that is not JSON", account=WHO
            )
        if resp.status == 400 or data.get("error"):
            reason = str(data.get("reason", "bad request"))[:200]
            raise AccountFailure(
                "invalid-param",
                f"Open-Meteo refused the request: {reason}",
                hint="check the coordinates (latitude -90..90, longitude -180..180) or the days.",
                param="latitude",
            )
        return data

    def geocode(self, name: str) -> Place:
        data = self._get(
            self.geocoding_url, {"name": name, "count": "5", "language": "en", "format": "json"}
        )
        results = data.get("results")
        if not isinstance(results, list) or not results or not isinstance(results[0], dict):
            raise AccountFailure(
                "unknown-place",
                f"no place called {name[:80]!r} was found",
                hint='try the city\'s name alone ("Valletta"), or pass latitude and longitude.',
                param="place",
            )
        top = results[0]
        try:
            lat, lon = float(top["latitude"]), float(top["longitude"])
        except (KeyError, TypeError, ValueError):
            raise AccountFailure(
                "service-unreachable",
                "Open-Meteo's geocoding answer has no coordinates",
                account=WHO,
            ) from None
        where = str(top.get("country_code") or top.get("country") or "")
        label = f"{top.get('name', name)}, {where}" if where else str(top.get("name", name))
        return Place(label[:120], lat, lon, str(top.get("timezone") or "auto"))

    def forecast(self, place: Place, *, units: Units, days: int) -> dict[str, Any]:
        params = {
            "latitude": f"{place.latitude:.4f}",
            "longitude": f"{place.longitude:.4f}",
            "current": CURRENT,
            "daily": DAILY,
            "timezone": place.timezone,
            "forecast_days": str(days),
        }
        if units == "imperial":
            params.update(
                temperature_unit="fahrenheit", wind_speed_unit="mph", precipitation_unit="inch"
            )
        data = self._get(self.forecast_url, params)
        if not isinstance(data.get("current"), dict):
            raise AccountFailure(
                "service-unreachable", "Open-Meteo's forecast has no current block", account=WHO
            )
        return data


def current_body(place: Place, data: dict[str, Any], units: Units) -> dict[str, Any]:
    """The seed's shape: location, condition, temperature (``temperature_c`` or ``_f``, in
    the units asked for), and the other scale beside it: the 1.5B model asked for Lisbon in
    Fahrenheit called without ``units`` and gave the Celsius figure as Fahrenheit."""
    now = data["current"]
    value = now.get("temperature_2m")
    imperial = units == "imperial"
    body = {
        "location": place.label,
        "condition": condition(now.get("weather_code")),
        "temperature_f" if imperial else "temperature_c": value,
    }
    if isinstance(value, int | float) and not isinstance(value, bool):
        other = (value - 32) * 5 / 9 if imperial else value * 9 / 5 + 32
        body["temperature_c" if imperial else "temperature_f"] = round(other, 1)
    return body


def forecast_body(place: Place, data: dict[str, Any], units: Units) -> dict[str, Any]:
    now = data["current"]
    cu = data.get("current_units") or {}
    du = data.get("daily_units") or {}
    daily = data.get("daily") or {}
    days = []
    times = daily.get("time") or []

    def at(name: str, i: int) -> Any:
        values = daily.get(name)
        return values[i] if isinstance(values, list) and i < len(values) else None

    for i, date in enumerate(times if isinstance(times, list) else []):
        days.append(
            {
                "date": date,
                "condition": condition(at("weather_code", i)),
                "temperature_max": at("temperature_2m_max", i),
                "temperature_min": at("temperature_2m_min", i),
                "precipitation": at("precipitation_sum", i),
                "precipitation_probability": at("precipitation_probability_max", i),
                "wind_speed_max": at("wind_speed_10m_max", i),
            }
        )
    return {
        "location": place.label,
        "timezone": data.get("timezone", ""),
        "current": {
            "time": now.get("time"),
            "condition": condition(now.get("weather_code")),
            "temperature": now.get("temperature_2m"),
            "feels_like": now.get("apparent_temperature"),
            "humidity": now.get("relative_humidity_2m"),
            "wind_speed": now.get("wind_speed_10m"),
            "wind_direction": now.get("wind_direction_10m"),
        },
        "units": {
            "temperature": cu.get("temperature_2m", "°F" if units == "imperial" else "°C"),
            "wind_speed": cu.get("wind_speed_10m", ""),
            "precipitation": du.get("precipitation_sum", ""),
            "humidity": cu.get("relative_humidity_2m", "%"),
        },
        "days": days,
    }
