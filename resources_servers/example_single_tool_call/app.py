"""The smallest useful environment: one tool call, then an answer.

It exists to check that a policy (and the whole stack: agent, model server, verify) can make a
single well-formed tool call and then close the turn with a real reply. The weather is derived
from a hash of the city name, so rewards are reproducible and nothing touches the network.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, Field

from polygym import ResourcesServer, Session, VerifyRequest, VerifyResponse, item_text, tool

# (condition, lowest, highest Celsius): the temperature stays plausible for the condition.
CONDITIONS = (("sunny", 18, 34), ("cloudy", 8, 22), ("light rain", 6, 20), ("snow", -12, 1), ("fog", 2, 14))


def normalize_city(city: str) -> str:
    """Case- and whitespace-insensitive key, so 'new  york ' and 'New York' are one city."""
    return " ".join(city.split()).casefold()


def weather_for(city: str) -> str:
    """Deterministic weather: sha256 rather than ``hash()``, which is salted per process."""
    digest = hashlib.sha256(normalize_city(city).encode()).digest()
    condition, low, high = CONDITIONS[digest[0] % len(CONDITIONS)]
    return f"{condition}, {low + digest[1] % (high - low + 1)} degrees Celsius"


class GetWeatherRequest(BaseModel):
    city: str = Field(description="Name of the city, e.g. 'Lisbon' or 'New York'.")


class GetWeatherResponse(BaseModel):
    city: str
    weather_description: str


class WeatherVerifyRequest(VerifyRequest):
    expected_city: str


class WeatherVerifyResponse(WeatherVerifyRequest, VerifyResponse):
    called_tool: bool
    called_city: str | None
    answered: bool


class ExampleSingleToolCall(ResourcesServer):
    @tool
    async def get_weather(self, body: GetWeatherRequest) -> GetWeatherResponse:
        """Get the current weather for a city."""
        return GetWeatherResponse(
            city=body.city, weather_description=f"{body.city}: {weather_for(body.city)}"
        )

    async def verify(self, body: WeatherVerifyRequest, session: Session) -> WeatherVerifyResponse:
        """Reward 1 when the last get_weather call named the expected city and the model then answered.

        The last call counts because the answer should reflect the latest lookup; malformed JSON
        arguments count as no city. 'Answered' means the output ends with non-empty assistant text.
        """
        calls = [c for c in body.response.function_calls() if c.name == "get_weather"]
        city = (calls[-1].arguments or {}).get("city") if calls else None
        city = city if isinstance(city, str) else None
        last = body.response.output[-1] if body.response.output else {}
        answered = last.get("type") == "message" and last.get("role", "assistant") == "assistant"
        answered = answered and bool(item_text(last).strip())
        correct = city is not None and normalize_city(city) == normalize_city(body.expected_city)
        return WeatherVerifyResponse(
            **body.model_dump(),
            reward=1.0 if correct and answered else 0.0,
            called_tool=bool(calls),
            called_city=city,
            answered=answered,
        )
