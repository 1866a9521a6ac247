"""weather against a loopback server that answers with Open-Meteo's documented JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from abilities.weather import Weather, WeatherParams
from chalie.accounts.store import AccountStore
from chalie.personal.runtime import PersonalRuntime, PersonalSettings
from chalie.services import Services
from tests.personal import open_meteo
from tools.personal_servers import Http, free_port, http_server


@pytest.fixture
def meteo() -> Iterator[Http]:
    with http_server(open_meteo.route) as srv:
        yield srv


def weather(book: AccountStore, forecast_url: str, geocoding_url: str) -> Weather:
    rt = PersonalRuntime(
        book,
        PersonalSettings(forecast_url=forecast_url, geocoding_url=geocoding_url, weather_timeout=5),
    )
    return Weather(None, Services(personal=rt))


def test_current_weather_by_place_has_the_seeds_body(book: AccountStore, meteo: Http) -> None:
    w = weather(book, f"{meteo.url}/v1/forecast", f"{meteo.url}/v1/search")
    result = w.run(WeatherParams(place="Valletta"))
    assert result.ok, result.body
    assert json.loads(result.body) == {
        "location": "Valletta, MT",
        "condition": "Clear",
        "temperature_c": 24.1,
        "temperature_f": 75.4,  # the other scale beside it (24.1 * 9 / 5 + 32 = 75.38)
    }
    # geocoded first, then the forecast for the place's coordinates in its own zone
    assert meteo.hits[0].startswith("/v1/search?name=Valletta")
    assert "latitude=35.8997" in meteo.hits[1] and "timezone=Europe%2FMalta" in meteo.hits[1]


def test_forecast_by_coordinates_in_imperial_units(book: AccountStore, meteo: Http) -> None:
    w = weather(book, f"{meteo.url}/v1/forecast", f"{meteo.url}/v1/search")
    result = w.run(
        WeatherParams(action="forecast", latitude=64.1, longitude=-21.9, days=3, units="imperial")
    )
    assert result.ok, result.body
    body = json.loads(result.body)
    assert body["location"] == "64.10, -21.90"
    assert body["current"]["condition"] == "Slight snow fall"
    assert body["current"]["temperature"] == 25.7
    assert body["units"]["temperature"] == "°F"
    assert [d["condition"] for d in body["days"]] == ["Clear", "Slight rain", "Thunderstorm"]
    assert body["days"][1]["precipitation_probability"] == 80
    imperial = w.run(WeatherParams(place="Reykjavik", units="imperial"))
    assert json.loads(imperial.body) == {
        "location": "Reykjavík, IS",
        "condition": "Slight snow fall",
        "temperature_f": 25.7,
        "temperature_c": -3.5,  # (25.7 - 32) * 5 / 9 = -3.5
    }


def test_unknown_place_and_missing_inputs_are_structured(book: AccountStore, meteo: Http) -> None:
    w = weather(book, f"{meteo.url}/v1/forecast", f"{meteo.url}/v1/search")
    nowhere = w.run(WeatherParams(place="Atlantis-under-the-sea"))
    assert nowhere.code == "unknown-place" and nowhere.hint
    missing = w.run(WeatherParams(latitude=10.0))
    assert missing.code == "missing-params"


def test_an_unreachable_or_broken_service_is_service_unreachable(
    book: AccountStore, meteo: Http
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    for forecast_url in (
        f"{dead}/v1/forecast",
        f"{meteo.url}/broken/v1/forecast",
        f"{meteo.url}/down/v1/forecast",
    ):
        w = weather(book, forecast_url, f"{meteo.url}/v1/search")
        result = w.run(WeatherParams(place="Valletta"))
        assert result.code == "service-unreachable", (forecast_url, result.body)
        assert "Traceback" not in result.body
