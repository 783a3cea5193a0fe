"""Speculative decoding through the real `openai` SDK: a seeded reply is the same with prompt
lookup on (the default) and off (`"speculative": false`), for an editor's request sampled with
filters and penalties, under a JSON schema and with a forced tool call; `/metrics` counts the
drafted and kept tokens; `seedbar serve --no-speculative` drafts nothing; a wrong
`speculative` value is a 400 in OpenAI's error shape."""

from pathlib import Path

import openai
import pytest
from openai import OpenAI

from conftest import DEFAULT_MODEL, serving

EDITOR = (Path(__file__).resolve().parent.parent / "scripts" / "bench-editor.txt").read_text()
READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file of the project",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def both(client, **kwargs):
    """The same seeded request with speculation on and off: the two messages."""
    kwargs = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": EDITOR}], "seed": 11, **kwargs}
    extra = kwargs.pop("extra_body", {})
    on = client.chat.completions.create(**kwargs, extra_body=extra).choices[0].message
    off = client.chat.completions.create(**kwargs, extra_body={**extra, "speculative": False}).choices[0].message
    return on, off


def test_an_editors_reply_is_the_same_with_and_without_speculation(client, server):
    before = server.metrics()
    for sampling in ({"temperature": 0}, {"temperature": 0.7, "top_p": 0.9, "frequency_penalty": 0.2},
                     {"temperature": 1.2, "extra_body": {"min_p": 0.05, "top_k": 40}}):
        on, off = both(client, max_tokens=160, **sampling)
        assert on.content and on.content == off.content, sampling
    after = server.metrics()
    drafted = after["seedbar_drafted_tokens_total"] - before.get("seedbar_drafted_tokens_total", 0)
    kept = after["seedbar_accepted_draft_tokens_total"] - before.get("seedbar_accepted_draft_tokens_total", 0)
    assert 0 < kept <= drafted, (kept, drafted)
    steps = after["seedbar_engine_steps_total"] - before.get("seedbar_engine_steps_total", 0)
    generated = after["seedbar_generated_tokens_total"] - before["seedbar_generated_tokens_total"]
    assert steps < generated, "kept drafts make fewer steps than tokens"


def test_structured_and_tool_call_replies_are_the_same_too(client):
    schema = {"type": "object", "properties": {"code": {"type": "string", "maxLength": 300}},
              "required": ["code"], "additionalProperties": False}
    on, off = both(client, max_tokens=200, temperature=0.7,
                   response_format={"type": "json_schema", "json_schema": {"name": "file", "schema": schema}})
    assert on.content == off.content and on.content.startswith("{")
    forced = {"type": "function", "function": {"name": "read_file"}}
    on, off = both(client, max_tokens=64, temperature=0.7, tools=[READ_FILE], tool_choice=forced)
    assert on.tool_calls and on.tool_calls[0].function.name == "read_file"
    assert on.tool_calls[0].function.arguments == off.tool_calls[0].function.arguments


def test_a_wrong_speculative_value_is_refused(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=DEFAULT_MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2, extra_body={"speculative": "sometimes"})
    assert "speculative" in str(refused.value)


def test_the_server_setting_turns_it_off(seedbar, client):
    with serving(seedbar, "--no-speculative") as plain:
        off = OpenAI(base_url=plain.base_url, api_key="unused", max_retries=0, timeout=300)
        kwargs = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": EDITOR}], "seed": 11,
                  "temperature": 0, "max_tokens": 96}
        reply = off.chat.completions.create(**kwargs).choices[0].message.content
        metrics = plain.metrics()
        assert metrics["seedbar_drafted_tokens_total"] == 0
        assert metrics["seedbar_engine_steps_total"] >= metrics["seedbar_generated_tokens_total"]
    assert reply == client.chat.completions.create(**kwargs).choices[0].message.content
