"""The request shapes editors and their HTTP clients send, against the real server: `null` for
every optional field they do not set (Zed's Rust structs, Go and Rust clients: OpenAI and
Ollama take it), Zed's Ollama messages with `images: null`, earlier turns' reasoning sent back
(Anthropic `thinking` blocks, Responses `reasoning` items: left out of the prompt), Copilot's
tool-call history with content parts, and Continue's chat with `stream_options`. Each must be
answered, not refused."""

import json

import httpx
import pytest

from conftest import DEFAULT_MODEL

READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        "strict": False,
    },
}


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def answered(http, path, body):
    resp = http.post(path, json=body)
    assert resp.status_code == 200, resp.text
    return resp


def sse_data(resp):
    return [line[len("data: "):] for line in resp.text.splitlines() if line.startswith("data: ")]


def test_openai_optional_fields_sent_as_null(http):
    chat = answered(http, "/v1/chat/completions", {
        "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi", "name": None}], "max_tokens": 2,
        "stream": None, "stream_options": None, "logprobs": None, "top_logprobs": None, "n": None, "seed": None,
        "stop": None, "tools": None, "tool_choice": None, "response_format": None, "temperature": None,
        "top_p": None, "presence_penalty": None, "frequency_penalty": None, "logit_bias": None, "user": None,
    }).json()
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] <= 2
    completion = answered(http, "/v1/completions", {
        "model": DEFAULT_MODEL, "prompt": "Hello", "max_tokens": 2, "echo": None, "suffix": None,
        "logprobs": None, "stream": None, "stop": None,
    }).json()
    assert completion["object"] == "text_completion" and completion["id"]


def test_zed_ollama_chat_with_null_images_and_thinking(http):
    reply = answered(http, "/api/chat", {
        "model": DEFAULT_MODEL, "stream": False, "keep_alive": -1, "think": False, "tools": [],
        "options": {"num_ctx": 4096, "num_predict": 2, "stop": [], "top_p": None},
        "messages": [
            {"role": "user", "content": "hi", "images": None},
            {"role": "assistant", "content": None, "thinking": "hmm", "tool_calls": None},
            {"role": "user", "content": "again"},
        ],
    }).json()
    assert reply["done"] is True and reply["message"]["role"] == "assistant"
    lines = answered(http, "/api/generate", {
        "model": DEFAULT_MODEL, "prompt": "hi", "stream": None, "raw": None, "system": None, "context": None,
        "format": None, "options": {"num_predict": 2},
    }).text.splitlines()
    last = json.loads(lines[-1])  # `stream: null` streams, as Ollama's default does
    assert len(lines) > 1 and last["done"] is True and last["context"]


def test_earlier_reasoning_is_taken_and_left_out(http):
    message = answered(http, "/v1/messages", {
        "model": DEFAULT_MODEL, "max_tokens": 2, "stop_sequences": None, "tools": None,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "hello"}]},
            {"role": "user", "content": "again"},
        ],
    }).json()
    assert message["type"] == "message" and message["content"][0]["type"] == "text"
    response = answered(http, "/v1/responses", {
        "model": DEFAULT_MODEL, "max_output_tokens": 2, "store": False, "tools": None, "text": None,
        "instructions": None, "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low"},
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "hello", "annotations": []}]},
            {"role": "user", "content": "again"},
        ],
    }).json()
    assert response["object"] == "response" and response["output"][0]["type"] == "message"


def test_copilot_tool_history_and_continue_stream_options(http):
    resp = answered(http, "/v1/chat/completions", {
        "model": DEFAULT_MODEL, "n": 1, "stream": True, "stream_options": {"include_usage": True},
        "temperature": 0.1, "top_p": 1, "max_tokens": 2, "tools": [READ_FILE], "tool_choice": "auto",
        "parallel_tool_calls": False,
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "You are a programming assistant."}]},
            {"role": "user", "content": [{"type": "text", "text": "Read a.txt"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "hello"}]},
            {"role": "user", "content": "thanks"},
        ],
    })
    data = sse_data(resp)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] <= 2
    assert any(c["choices"] and c["choices"][0]["finish_reason"] for c in chunks)
