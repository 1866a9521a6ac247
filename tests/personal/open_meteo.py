"""Open-Meteo's documented JSON (forecast and geocoding APIs), served by a loopback route."""

from __future__ import annotations

from typing import Any

from tools.personal_servers import json_answer

GEOCODING = {
    "valletta": {
        "id": 2562305,
        "name": "Valletta",
        "latitude": 35.89968,
        "longitude": 14.5148,
        "elevation": 56.0,
        "feature_code": "PPLC",
        "country_code": "MT",
        "admin1_id": 8299709,
        "timezone": "Europe/Malta",
        "population": 6444,
        "country_id": 2562770,
        "country": "Malta",
        "admin1": "Il-Belt Valletta",
    },
    "reykjavik": {
        "id": 3413829,
        "name": "Reykjavík",
        "latitude": 64.13548,
        "longitude": -21.89541,
        "country_code": "IS",
        "timezone": "Atlantic/Reykjavik",
        "country": "Iceland",
    },
}


def forecast(query: dict[str, list[str]]) -> dict[str, Any]:
    lat = float(query["latitude"][0])
    imperial = query.get("temperature_unit", [""])[0] == "fahrenheit"
    days = int(query.get("forecast_days", ["7"])[0])
    cold = lat > 60
    temp = -3.5 if cold else 24.1
    if imperial:
        temp = round(temp * 9 / 5 + 32, 1)
    return {
        "latitude": lat,
        "longitude": float(query["longitude"][0]),
        "generationtime_ms": 0.05,
        "utc_offset_seconds": 3600,
        "timezone": query.get("timezone", ["GMT"])[0],
        "timezone_abbreviation": "CET",
        "elevation": 56.0,
        "current_units": {
            "time": "iso8601",
            "interval": "seconds",
            "temperature_2m": "°F" if imperial else "°C",
            "relative_humidity_2m": "%",
            "apparent_temperature": "°F" if imperial else "°C",
            "precipitation": "inch" if imperial else "mm",
            "weather_code": "wmo code",
            "wind_speed_10m": "mp/h" if imperial else "km/h",
            "wind_direction_10m": "°",
            "is_day": "",
        },
        "current": {
            "time": "2026-12-01T19:00",
            "interval": 900,
            "temperature_2m": temp,
            "relative_humidity_2m": 61,
            "apparent_temperature": temp - 1,
            "precipitation": 0.0,
            "weather_code": 71 if cold else 0,
            "wind_speed_10m": 12.3,
            "wind_direction_10m": 290,
            "is_day": 0,
        },
        "daily_units": {
            "time": "iso8601",
            "weather_code": "wmo code",
            "temperature_2m_max": "°C",
            "temperature_2m_min": "°C",
            "precipitation_sum": "mm",
            "precipitation_probability_max": "%",
            "wind_speed_10m_max": "km/h",
        },
        "daily": {
            "time": [f"2026-12-{d + 1:02d}" for d in range(days)],
            "weather_code": [[0, 61, 95][d % 3] for d in range(days)],
            "temperature_2m_max": [20.0 + d for d in range(days)],
            "temperature_2m_min": [12.0 + d for d in range(days)],
            "precipitation_sum": [0.0, 4.2, 11.0][:days] + [0.0] * max(0, days - 3),
            "precipitation_probability_max": [5, 80, 95][:days] + [0] * max(0, days - 3),
            "wind_speed_10m_max": [15.1] * days,
        },
    }


def route(
    path: str, query: dict[str, list[str]], headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    if path == "/v1/search":
        name = query.get("name", [""])[0].lower()
        found = GEOCODING.get(name)
        return json_answer(
            {"results": [found], "generationtime_ms": 0.4} if found else {"generationtime_ms": 0.4}
        )
    if path == "/v1/forecast":
        lat = float(query.get("latitude", ["0"])[0])
        if not -90 <= lat <= 90:
            return json_answer(
                {"error": True, "reason": "Latitude must be in range of -90 to 90°."}, 400
            )
        return json_answer(forecast(query))
    if path == "/broken/v1/forecast":
        return 200, {"Content-Type": "text/html"}, b"<html>gateway</html>"
    if path == "/down/v1/forecast":
        return 503, {}, b""
    return json_answer({"error": True, "reason": "not found"}, 404)
