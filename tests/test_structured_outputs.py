"""Structured outputs through the real clients: the `openai` SDK's `parse` with a pydantic model
(a strict JSON schema with `const`, `enum`, a nested object and an array: every one of 48
seeded samples valid, 104 in `make soak`: SEEDBAR_SCHEMA_SEEDS seeds of 8 samples), JSON mode, forced tool calls (`required` and a named function: exactly
one valid call), streaming, Ollama's `format`, and the 400s for what cannot be enforced."""

import json
import os
from typing import Annotated, Literal

import httpx
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel, ConfigDict, Field

from conftest import DEFAULT_MODEL

# Seeds of 8 samples each for the pydantic schema test (`make soak` asks for 13).
SCHEMA_SEEDS = int(os.environ.get("SEEDBAR_SCHEMA_SEEDS", "6"))


class Place(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=16)
    population: int = Field(ge=0, le=99_999_999)


class CityCard(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["city"]
    size: Literal["small", "medium", "large"]
    place: Place
    tags: list[Annotated[str, Field(max_length=12)]] = Field(max_length=2)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def ask(text):
    return [{"role": "user", "content": text}]


def test_a_pydantic_schema_is_obeyed_by_every_seeded_sample(client):
    samples = []
    for seed in range(SCHEMA_SEEDS):
        completion = client.chat.completions.parse(
            model=DEFAULT_MODEL,
            messages=ask("Describe a city you like as a card."),
            response_format=CityCard,
            n=8,
            seed=seed,
            temperature=1.0,
            max_tokens=120,
        )
        for choice in completion.choices:
            assert choice.finish_reason == "stop", choice.message.content
            assert isinstance(choice.message.parsed, CityCard), choice.message.content
            samples.append(choice.message.content)
    assert len(samples) == 8 * SCHEMA_SEEDS
    assert len(set(samples)) > 10, "seeded samples should differ"


def test_json_mode_answers_one_object(client):
    completion = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=ask("Give me a JSON object about the Moon."),
        response_format={"type": "json_object"},
        seed=3,
        max_tokens=80,
    )
    choice = completion.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # cut by max_tokens: still an object's prefix
        assert choice.message.content.startswith("{")


def test_legacy_completions_take_a_response_format_too(client):
    completion = client.completions.create(
        model=DEFAULT_MODEL, prompt="A city card:", max_tokens=120, seed=2,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "card", "schema": Place.model_json_schema()}}},
    )
    assert completion.choices[0].finish_reason == "stop"
    Place.model_validate_json(completion.choices[0].text)


def test_a_streamed_structured_reply_joins_to_valid_json(client):
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=ask("Describe Paris as a card."),
        response_format={"type": "json_schema", "json_schema": {"name": "card", "schema": CityCard.model_json_schema()}},
        seed=11,
        max_tokens=120,
        stream=True,
    )
    text, reasons = "", []
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reasons.append(choice.finish_reason)
    assert reasons[-1] == "stop"
    CityCard.model_validate_json(text)


def test_tool_choice_required_always_yields_exactly_one_valid_call(client):
    for seed in range(3):
        completion = client.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=ask("Hello there!"),
            tools=[WEATHER, ADD],
            tool_choice="required",
            n=8,
            seed=seed,
            max_tokens=80,
        )
        for choice in completion.choices:
            assert choice.finish_reason == "tool_calls", choice.message
            calls = choice.message.tool_calls
            assert calls is not None and len(calls) == 1, choice.message
            arguments = json.loads(calls[0].function.arguments)
            if calls[0].function.name == "get_weather":
                assert isinstance(arguments["city"], str)
                assert arguments["unit"] in ("celsius", "fahrenheit")
            else:
                assert calls[0].function.name == "add"
                assert isinstance(arguments["a"], int) and isinstance(arguments["b"], int)


def test_a_forced_call_gets_only_the_arguments_its_tool_lists(client):
    # No `additionalProperties`: JSON schema would allow any others, and a small model then
    # keeps inventing arguments until max_tokens cuts the call off.
    loose = {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string", "maxLength": 40}}}}}
    completion = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=ask("Find me a recipe for bread."), tools=[loose],
        tool_choice="required", n=8, seed=2, temperature=1.0, max_tokens=60,
    )
    for choice in completion.choices:
        assert choice.finish_reason == "tool_calls", choice.message
        (call,) = choice.message.tool_calls
        assert set(json.loads(call.function.arguments)) <= {"query"}, call.function.arguments


def test_a_named_tool_choice_calls_that_function(client):
    completion = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=ask("What is the weather in Oslo?"),
        tools=[WEATHER, ADD],
        tool_choice={"type": "function", "function": {"name": "add"}},
        n=4,
        seed=5,
        max_tokens=60,
    )
    for choice in completion.choices:
        (call,) = choice.message.tool_calls
        assert call.function.name == "add"
        assert set(json.loads(call.function.arguments)) == {"a", "b"}


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}}, "response_format", "strnig"),
        ({"response_format": {"type": "yaml"}}, "response_format", ""),
        ({"stream_options": {"include_usage": True}}, "stream_options", "stream"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
        ({"tool_choice": "required"}, "tool_choice", "tool"),
        ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format", "both"),
    ],
)
def test_what_cannot_be_enforced_is_a_400(client, fields, param, words):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=DEFAULT_MODEL, messages=ask("hi"), max_tokens=4, **fields)
    assert error.value.body["param"].startswith(param), error.value.body
    assert words in error.value.body["message"]


def test_ollama_format_schema_and_json(server):
    schema = Place.model_json_schema()
    with httpx.Client(base_url=server.url, timeout=120) as http:
        reply = http.post(
            "/api/chat",
            json={"model": DEFAULT_MODEL, "messages": ask("Describe Paris."), "format": schema,
                  "stream": False, "options": {"seed": 4, "num_predict": 80}},
        )
        assert reply.status_code == 200, reply.text
        Place.model_validate_json(reply.json()["message"]["content"])

        reply = http.post(
            "/api/generate",
            json={"model": DEFAULT_MODEL, "prompt": "A JSON object about cats:", "format": "json",
                  "stream": False, "options": {"seed": 4, "num_predict": 120}},
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["response"].startswith("{")

        bad = http.post("/api/chat", json={"model": DEFAULT_MODEL, "messages": ask("hi"), "format": "yaml"})
        assert bad.status_code == 400 and "format" in bad.json()["error"]
