"""The smallest useful environment: one tool call, then an answer.

It exists to check that a policy (and the whole stack: agent, model server, verify) can make a
single well-formed tool call and then close the turn with a real reply. Tool and rows match NeMo
Gym's same-named server (0.4-0.7): ``get_weather`` answers the same fixed sentence, and a row
without ``expected_city`` (NeMo Gym's rows) is rewarded, as there, for any ``get_weather`` call.
A row with ``expected_city`` (polygym's rows) asks more: that city, then an answer.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from polygym import ResourcesServer, Session, VerifyRequest, VerifyResponse, item_text, tool


def normalize_city(city: str) -> str:
    """Case- and whitespace-insensitive key, so 'new  york ' and 'New York' are one city."""
    return " ".join(city.split()).casefold()


class GetWeatherRequest(BaseModel):
    city: str = Field(description="Name of the city, e.g. 'Lisbon' or 'New York'.")


class GetWeatherResponse(BaseModel):
    city: str
    weather_description: str


class WeatherVerifyRequest(VerifyRequest):
    # Absent in NeMo Gym's rows, whose verifier only asks for a get_weather call.
    expected_city: str | None = None


class WeatherVerifyResponse(WeatherVerifyRequest, VerifyResponse):
    called_tool: bool
    called_city: str | None
    answered: bool


class ExampleSingleToolCall(ResourcesServer):
    reverify_mode = "stateless"  # verify reads only the row and the response

    @tool
    async def get_weather(self, body: GetWeatherRequest) -> GetWeatherResponse:
        """Get the current weather for a city."""
        return GetWeatherResponse(city=body.city, weather_description=f"The weather in {body.city} is cold.")

    async def verify(self, body: WeatherVerifyRequest, session: Session) -> WeatherVerifyResponse:
        """Reward 1 when the last get_weather call named the expected city and the model then answered.

        Without ``expected_city`` (a NeMo Gym row) any get_weather call earns 1, as NeMo Gym's
        verifier gives. The last call counts because the answer should reflect the latest lookup;
        malformed JSON arguments count as no city. 'Answered' means the output ends with non-empty
        assistant text.
        """
        calls = [c for c in body.response.function_calls() if c.name == "get_weather"]
        city = (calls[-1].arguments or {}).get("city") if calls else None
        city = city if isinstance(city, str) else None
        last = body.response.output[-1] if body.response.output else {}
        answered = last.get("type") == "message" and last.get("role", "assistant") == "assistant"
        answered = answered and bool(item_text(last).strip())
        if body.expected_city is None:
            earned = bool(calls)
        else:
            named = city is not None and normalize_city(city) == normalize_city(body.expected_city)
            earned = answered and named
        return WeatherVerifyResponse.of(
            body,
            reward=1.0 if earned else 0.0,
            called_tool=bool(calls),
            called_city=city,
            answered=answered,
        )
