"""langchain against the real server and SmolLM2: `langchain-openai`'s ChatOpenAI (invoke,
stream, a seeded reply reproducible, `with_structured_output` with a pydantic model through a
strict JSON schema, `bind_tools` with a forced `tool_choice`) and `langchain-ollama`'s
ChatOllama (invoke, stream, a schema `format`)."""

from typing import Literal

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_ollama import ChatOllama
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field

from conftest import DEFAULT_MODEL


class Pet(BaseModel):
    """A pet."""

    model_config = ConfigDict(extra="forbid")
    species: Literal["cat", "dog", "fish"]
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=30)


class GetWeather(BaseModel):
    """Current weather in a city."""

    city: str = Field(max_length=20)
    unit: Literal["celsius", "fahrenheit"]


def chat_openai(server, **settings):
    settings = {"max_tokens": 12, "temperature": 0.8, "seed": 7, **settings}
    return ChatOpenAI(
        model=DEFAULT_MODEL, base_url=server.base_url, api_key="unused", max_retries=0, timeout=120, **settings
    )


@pytest.fixture(scope="module")
def chat(server):
    return chat_openai(server)


def test_chat_openai_invokes_and_counts_usage(chat):
    reply = chat.invoke("Say hello in one word.")
    assert isinstance(reply.content, str) and reply.content.strip()
    assert reply.response_metadata["model_name"] == DEFAULT_MODEL
    assert reply.response_metadata["finish_reason"] in ("stop", "length")
    usage = reply.usage_metadata
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 12
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_chat_openai_streams_the_same_seeded_reply_it_invokes(chat):
    question = "Name three colours."
    whole = chat.invoke(question).content
    assert chat.invoke(question).content == whole, "a seeded reply is reproducible"
    chunks = list(chat.stream(question, stream_usage=True))
    assert len(chunks) > 2 and all(isinstance(c, AIMessageChunk) for c in chunks)
    joined = chunks[0]
    for chunk in chunks[1:]:
        joined += chunk
    assert joined.content == whole
    assert joined.usage_metadata["output_tokens"] > 0
    assert joined.response_metadata["finish_reason"] in ("stop", "length")


def test_with_structured_output_gives_a_valid_pydantic_object(server):
    for seed in range(2):
        structured = chat_openai(server, max_tokens=60, seed=seed).with_structured_output(
            Pet, method="json_schema", include_raw=True
        )
        out = structured.invoke("Describe a pet as JSON.")
        assert out["parsing_error"] is None, out["raw"]
        pet = out["parsed"]
        assert isinstance(pet, Pet)
        assert pet.species in ("cat", "dog", "fish") and 0 <= pet.age <= 30


def test_bind_tools_with_a_forced_choice_gives_a_valid_call(server):
    chat = chat_openai(server, max_tokens=60)
    for choice in ("GetWeather", "any"):
        forced = chat.bind_tools([GetWeather], tool_choice=choice)
        reply = forced.invoke("What is the weather in Paris?")
        assert reply.response_metadata["finish_reason"] == "tool_calls"
        assert len(reply.tool_calls) == 1, reply
        call = reply.tool_calls[0]
        assert call["name"] == "GetWeather" and call["id"]
        GetWeather.model_validate(call["args"])
        assert not reply.invalid_tool_calls


@pytest.fixture(scope="module")
def ollama_chat(server):
    return ChatOllama(model=DEFAULT_MODEL, base_url=server.url, num_predict=12, seed=7, temperature=0.8)


def test_chat_ollama_invokes_and_streams(ollama_chat):
    reply = ollama_chat.invoke("Say hello in one word.")
    assert reply.content.strip()
    assert reply.usage_metadata["output_tokens"] > 0
    assert reply.response_metadata["model"] == DEFAULT_MODEL
    chunks = list(ollama_chat.stream("Say hello in one word."))
    assert "".join(c.content for c in chunks) == reply.content, "a seeded reply is reproducible"


def test_chat_ollama_structured_output_follows_the_schema(server):
    chat = ChatOllama(model=DEFAULT_MODEL, base_url=server.url, num_predict=60, seed=3)
    pet = chat.with_structured_output(Pet, method="json_schema").invoke("Describe a pet as JSON.")
    assert isinstance(pet, Pet)
