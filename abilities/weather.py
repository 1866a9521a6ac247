"""weather: current conditions and the daily forecast by place name or coordinates (Open-Meteo)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from chalie.ability import Ability
from chalie.accounts.failure import AccountFailure
from chalie.result import ToolResult


class WeatherParams(msgspec.Struct, forbid_unknown_fields=True):
    """Weather now, or the forecast, for a place."""

    action: Literal["current", "forecast"] = "current"
    place: (
        Annotated[
            str,
            msgspec.Meta(
                min_length=1, max_length=120, description="a city or place, e.g. Valletta"
            ),
        ]
        | None
    ) = None
    latitude: Annotated[float, msgspec.Meta(ge=-90, le=90)] | None = None
    longitude: Annotated[float, msgspec.Meta(ge=-180, le=180)] | None = None
    days: Annotated[int, msgspec.Meta(ge=1, le=16, description="forecast days")] = 3
    units: Literal["metric", "imperial"] = "metric"


class Weather(Ability):
    name = "weather"
    summary = (
        "Weather: the current conditions and the daily forecast (temperature, rain, wind) "
        "for a city or coordinates."
    )
    tooltip = "Weather now and forecast"
    examples = (
        "what's the weather in Valletta",
        "is it going to rain tomorrow in London",
        "how hot is it in Madrid right now",
        "weather forecast for Paris this week",
        "do I need an umbrella today",
        "what's the temperature outside today",
    )
    Params = WeatherParams
    actions = {"current": (), "forecast": ()}
    timeout = 30.0

    def run(self, params: WeatherParams) -> ToolResult:
        from chalie.personal.runtime import runtime_of
        from chalie.personal.weather import OpenMeteo, Place, current_body, forecast_body

        rt = runtime_of(self)
        if isinstance(rt, ToolResult):
            return rt
        if params.place is None and (params.latitude is None or params.longitude is None):
            return ToolResult.error(
                "missing-params",
                "weather needs a place, or latitude and longitude.",
                hint="pass place=Valletta (or the user's city), or both coordinates.",
                meta={"param": "place"},
            )
        s = rt.settings
        client = OpenMeteo(s.forecast_url, s.geocoding_url, s.weather_timeout)
        try:
            if params.place is not None:
                place = client.geocode(params.place)
            else:
                assert params.latitude is not None and params.longitude is not None
                place = Place(
                    f"{params.latitude:.2f}, {params.longitude:.2f}",
                    params.latitude,
                    params.longitude,
                )
            days = params.days if params.action == "forecast" else 1
            data = client.forecast(place, units=params.units, days=days)
        except AccountFailure as exc:
            return exc.result()
        finally:
            client.close()
        if params.action == "current":
            return ToolResult.success(current_body(place, data, params.units))
        return ToolResult.success(
            forecast_body(place, data, params.units), meta={"action": "forecast"}
        )
