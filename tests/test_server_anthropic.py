"""`seedbar serve`'s Anthropic Messages API through the official `anthropic` Python SDK: a plain
message, a system prompt, streaming (event order, deltas that join to the reply), a tool-use
round trip, count_tokens, the `x-api-key` key, errors as the SDK's exceptions, and a stream
whose engine fails ending with an `error` event. One keyed server (with fault injection) for
the module."""

import json

import anthropic
import httpx
import pytest

from conftest import DEFAULT_MODEL, serving

KEY = "sk-anthropic-test"
QUESTION = "What is the capital of France? Answer in one sentence."
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def keyed(seedbar):
    with serving(seedbar, "--api-key", KEY, env={"SEEDBAR_FAULT_INJECTION": "1"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(keyed):
    # The SDK sends the key as `x-api-key`; no retries, so errors surface as they are.
    return anthropic.Anthropic(base_url=keyed.url, api_key=KEY, max_retries=0, timeout=120)


def user(text):
    return [{"role": "user", "content": text}]


# This SDK no longer has sampling parameters; they go in the body as extra fields.
GREEDY = {"temperature": 0}


def ask(client, messages, **kwargs):
    kwargs.setdefault("max_tokens", 16)
    kwargs.setdefault("extra_body", GREEDY)
    return client.messages.create(model=DEFAULT_MODEL, messages=messages, **kwargs)


def count(client, messages, **kwargs):
    return client.messages.count_tokens(model=DEFAULT_MODEL, messages=messages, **kwargs).input_tokens


def raw_events(server, body):
    """(event name, data) of a streamed /v1/messages, read off the wire."""
    events, name = [], None
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, headers=headers, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[len("data: "):])))
    return events


def test_a_plain_message_answers_in_anthropics_shape(client):
    raw = client.messages.with_raw_response.create(
        model=DEFAULT_MODEL, max_tokens=16, messages=user(QUESTION), extra_body={**GREEDY, "seed": 7},
        metadata={"user_id": "ignored"},
    )
    assert raw.headers["x-seedbar-seed"] == "7"
    message = raw.parse()
    assert message.id.startswith("msg_")
    assert (message.type, message.role, message.model) == ("message", "assistant", DEFAULT_MODEL)
    assert [b.type for b in message.content] == ["text"]
    assert "Paris" in message.content[0].text
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens == count(client, user(QUESTION))
    assert 0 < message.usage.output_tokens <= 16
    cut = ask(client, user(QUESTION), max_tokens=3)
    assert (cut.stop_reason, cut.usage.output_tokens) == ("max_tokens", 3)


def test_a_stop_sequence_is_named(client):
    message = ask(client, user(QUESTION), stop_sequences=["zzz", "Paris"])
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "Paris")
    assert "Paris" not in message.content[0].text


def test_the_system_prompt_is_part_of_the_prompt(client):
    plain = count(client, user(QUESTION))
    system = "You are a pirate. Answer like one."
    as_text = count(client, user(QUESTION), system=system)
    as_blocks = count(client, user(QUESTION), system=[{"type": "text", "text": system}])
    assert as_text == as_blocks != plain  # (without one, the template puts in its default)
    assert count(client, user(QUESTION), system=system + " Say arr a lot.") > as_text
    message = ask(client, user(QUESTION), system=[{"type": "text", "text": system}])
    assert message.usage.input_tokens == as_text


def test_streaming_follows_anthropics_event_order(client, keyed):
    expected = ask(client, user(QUESTION), max_tokens=12).content[0].text
    with client.messages.stream(model=DEFAULT_MODEL, max_tokens=12, messages=user(QUESTION),
                                extra_body=GREEDY) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(deltas) > 1
    assert "".join(deltas) == final.content[0].text == expected
    assert final.usage.output_tokens > 0

    events = raw_events(keyed, {"model": DEFAULT_MODEL, "max_tokens": 5, "temperature": 0, "stream": True,
                                "messages": user(QUESTION)})
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert all(data["type"] == name for name, data in events)
    assert events[0][1]["message"]["usage"]["input_tokens"] == count(client, user(QUESTION))
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2][1]["usage"]["output_tokens"] == 5


def test_a_tool_use_round_trip(client):
    question = user("What is the weather in Paris?")
    call = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}]}

    def result(text):
        return {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": text}]}]}

    asked = ask(client, question, tools=[WEATHER_TOOL])
    assert asked.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert count(client, question, tools=[WEATHER_TOOL]) > count(client, question)
    assert count(client, question, tools=[WEATHER_TOOL], tool_choice={"type": "none"}) == count(client, question)

    conversation = question + [call, result("Sunny, 22 degrees Celsius.")]
    answer = ask(client, conversation, tools=[WEATHER_TOOL])
    assert answer.content[0].type == "text" and answer.content[0].text
    assert answer.usage.input_tokens == count(client, conversation, tools=[WEATHER_TOOL])
    longer = question + [call, result("Sunny, 22 degrees Celsius, a light wind from the west.")]
    assert count(client, longer, tools=[WEATHER_TOOL]) > answer.usage.input_tokens


def test_a_forced_tool_is_always_called(client, keyed):
    # `any` and a named tool force one call by constrained decoding, even for a greeting.
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        answer = ask(client, user("Hello!"), tools=[WEATHER_TOOL], tool_choice=choice, max_tokens=48)
        assert answer.stop_reason == "tool_use", answer
        (block,) = [b for b in answer.content if b.type == "tool_use"]
        assert block.name == "get_weather" and isinstance(block.input["city"], str)
    events = raw_events(keyed, {"model": DEFAULT_MODEL, "max_tokens": 48, "stream": True, "temperature": 0,
                                "messages": user("Hello!"), "tools": [WEATHER_TOOL], "tool_choice": {"type": "any"}})
    partial = "".join(data["delta"]["partial_json"] for name, data in events
                      if name == "content_block_delta" and data["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == block.input
    assert [data["delta"]["stop_reason"] for name, data in events if name == "message_delta"] == ["tool_use"]


def test_the_api_key_is_checked(keyed):
    wrong = anthropic.Anthropic(base_url=keyed.url, api_key="sk-wrong", max_retries=0, timeout=60)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.create(model=DEFAULT_MODEL, max_tokens=4, messages=user("Hi"))
    assert e.value.body["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("kwargs, exception, fragment", [
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}}]}]},
     anthropic.BadRequestError, "image"),
    ({"messages": user("Hi"), "tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "nope"}},
     anthropic.BadRequestError, "'nope'"),
    ({"messages": user("Hi"), "model": "no-such-model"}, anthropic.NotFoundError, "no-such-model"),
])
def test_bad_requests_are_the_sdks_errors(client, kwargs, exception, fragment):
    kwargs = {"model": DEFAULT_MODEL, "max_tokens": 4, **kwargs}
    with pytest.raises(exception) as e:
        client.messages.create(**kwargs)
    assert e.value.body["type"] == "error"
    assert fragment in e.value.body["error"]["message"]


def test_a_failed_engine_ends_the_stream_with_an_error_event(keyed):
    # Last in the module: the injected fault makes the next request load the model afresh.
    events = raw_events(keyed, {"model": DEFAULT_MODEL, "max_tokens": 8, "stream": True,
                                "messages": user("SEEDBAR-FAULT please")})
    names = [name for name, _ in events]
    assert names[0] == "message_start"
    assert names[-1] == "error" and "message_stop" not in names
    assert events[-1][1]["type"] == "error"
    assert events[-1][1]["error"]["type"] == "api_error"
