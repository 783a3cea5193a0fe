"""litellm against the real server and SmolLM2, through its two routes to a local server: the
OpenAI-compatible provider (`openai/` with `api_base`: completion, stream, a pydantic
`response_format`, a forced tool call) and the Ollama chat provider (`ollama_chat/`: completion,
stream, a JSON schema `format`)."""

import json
import os

# litellm fetches its model price list over the network on import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
import pytest  # noqa: E402
from pydantic import BaseModel, ConfigDict, Field  # noqa: E402

from conftest import DEFAULT_MODEL  # noqa: E402


class Colour(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=12)
    warm: bool


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def ask(text):
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def openai_route(server):
    return {"model": f"openai/{DEFAULT_MODEL}", "api_base": server.base_url, "api_key": "unused"}


@pytest.fixture(scope="module")
def ollama_route(server):
    return {"model": f"ollama_chat/{DEFAULT_MODEL}", "api_base": server.url}


@pytest.mark.parametrize("route", ["openai_route", "ollama_route"])
def test_completion_and_stream_give_the_same_seeded_reply(request, route):
    provider = request.getfixturevalue(route)
    settings = dict(messages=ask("Name a fruit."), max_tokens=12, seed=11, temperature=0.8, **provider)
    reply = litellm.completion(**settings)
    text = reply.choices[0].message.content
    assert text.strip()
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 0 and 0 < reply.usage.completion_tokens <= 12
    chunks = list(litellm.completion(stream=True, **settings))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text


@pytest.mark.parametrize("route", ["openai_route", "ollama_route"])
def test_a_pydantic_response_format_is_obeyed(request, route):
    provider = request.getfixturevalue(route)
    reply = litellm.completion(
        messages=ask("Give a colour as JSON."), response_format=Colour, max_tokens=30, seed=2, **provider
    )
    Colour.model_validate_json(reply.choices[0].message.content)


def test_a_forced_tool_call_comes_back_as_a_call(openai_route):
    reply = litellm.completion(
        messages=ask("Weather in Rome?"),
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=30,
        **openai_route,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}
