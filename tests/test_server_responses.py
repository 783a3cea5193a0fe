"""`seedbar serve`'s OpenAI Responses API (stateless) through the official `openai` SDK's
`client.responses.create`: a plain response and a cut-short one, streaming (event order,
increasing sequence numbers, deltas that join to the text), function tools with a call and
its output sent back, structured output (`text.format`: the SDK's `responses.parse` with a
pydantic model), and `previous_response_id` refused."""

import json

import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel, ConfigDict, Field

from conftest import DEFAULT_MODEL

QUESTION = "What is the capital of France?"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def respond(client, **kwargs):
    kwargs.setdefault("input", QUESTION)
    kwargs.setdefault("max_output_tokens", 16)
    kwargs.setdefault("temperature", 0)
    return client.responses.create(model=DEFAULT_MODEL, store=False, **kwargs)


def test_a_response_in_openais_shape(client):
    raw = client.responses.with_raw_response.create(
        model=DEFAULT_MODEL, input=QUESTION, instructions="Answer in one sentence.", max_output_tokens=16,
        temperature=0, extra_body={"seed": 11},
    )
    assert raw.headers["x-seedbar-seed"] == "11"
    response = raw.parse()
    assert response.id.startswith("resp_")
    assert (response.object, response.status, response.model) == ("response", "completed", DEFAULT_MODEL)
    assert [item.type for item in response.output] == ["message"]
    assert response.output[0].role == "assistant"
    assert response.output[0].content[0].type == "output_text"
    assert "Paris" in response.output_text
    usage = response.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 16
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    # The instructions are part of the prompt.
    assert respond(client, max_output_tokens=1).usage.input_tokens != usage.input_tokens

    cut = respond(client, max_output_tokens=3)
    assert cut.status == "incomplete"
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3


def test_streaming_follows_openais_event_order(client):
    expected = respond(client, max_output_tokens=8).output_text
    events = list(respond(client, max_output_tokens=8, stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete" if events[-1].response.status == "incomplete" else "response.completed"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-4].text == events[-1].response.output_text == expected
    assert events[-1].response.usage.output_tokens > 0


def test_function_tools_and_a_call_round_trip(client):
    plain = respond(client, input="What is the weather in Paris?", max_output_tokens=4)
    with_tools = respond(client, input="What is the weather in Paris?", max_output_tokens=4, tools=[WEATHER_TOOL])
    assert with_tools.usage.input_tokens > plain.usage.input_tokens
    assert {item.type for item in with_tools.output} <= {"message", "function_call"}

    def conversation(output):
        return [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": output},
        ]

    answer = respond(client, input=conversation("Sunny, 22 degrees."), tools=[WEATHER_TOOL])
    assert answer.status in ("completed", "incomplete") and answer.output_text
    longer = respond(client, input=conversation("Sunny, 22 degrees, a light wind from the west."),
                     tools=[WEATHER_TOOL], max_output_tokens=1)
    assert longer.usage.input_tokens > answer.usage.input_tokens


def test_a_required_tool_choice_always_calls(client):
    forced = respond(client, input="Hello!", tools=[WEATHER_TOOL], tool_choice="required", max_output_tokens=48)
    (call,) = forced.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert isinstance(json.loads(call.arguments)["city"], str)
    events = list(respond(client, input="Hello!", tools=[WEATHER_TOOL], tool_choice="required",
                          max_output_tokens=48, stream=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == call.arguments


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


def test_text_format_is_enforced(client):
    parsed = client.responses.parse(
        model=DEFAULT_MODEL, input="Name a big city.", text_format=City, max_output_tokens=40, temperature=0,
        store=False,
    )
    assert isinstance(parsed.output_parsed, City), parsed.output_text
    streamed = list(respond(client, input="Name a big city.", max_output_tokens=40, stream=True,
                            text={"format": {"type": "json_object"}}))
    assert isinstance(json.loads(streamed[-1].response.output_text), dict)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"text": {"format": {"type": "json_object"}}, "tools": [WEATHER_TOOL], "tool_choice": "required"},
     "cannot both apply"),
    ({"previous_response_id": "resp_123"}, "stateless"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "'nope'"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "not fetched from the network"),
])
def test_bad_requests_are_400s(client, kwargs, fragment):
    with pytest.raises(openai.BadRequestError) as e:
        respond(client, **kwargs)
    assert fragment in e.value.message
