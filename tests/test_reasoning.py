"""Reasoning kept apart, through the real clients: a model whose template thinks (a random-weight
Qwen3 checkpoint whose template opens `<think>` in the prompt) answers with its thinking in
`reasoning_content` (the `openai` SDK, whole and streamed), `reasoning` output items (Responses),
`thinking` blocks (the `anthropic` SDK) and `message.thinking` (the `ollama` client), and in the
app's reply stream and store; requests turn it off (`reasoning_effort: none`,
`chat_template_kwargs`, Anthropic `thinking`, Ollama `think`). Every split is checked against
the same seeded reply's raw text from `/v1/completions` on the template's own rendering, so the
thinking is exactly the text before `</think>` and the answer the text after it. The real
SmolLM2, whose template does not think, shows no reasoning field anywhere."""

import json
import threading

import anthropic
import httpx
import ollama
import pytest
from openai import OpenAI
from transformers.utils.chat_template_utils import render_jinja_template

from checkpoints import THINKING_TEMPLATE, write_checkpoint
from conftest import DEFAULT_MODEL, Seedbar, default_gguf, serving

THINKER = "thinker"
QUESTION = [{"role": "user", "content": "What is 2+2?"}]
MAX_TOKENS = 64
# What Rust's `str::trim` takes away (Python's `strip` also takes \x1c-\x1f).
RUST_BLANKS = " \t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("reasoning")
    sb = Seedbar(root / "home")
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    sb.run("models", "add", write_checkpoint(root / "thinker", "qwen3", thinking=True), "--name", THINKER)
    return sb


@pytest.fixture(scope="module")
def server(store):
    with serving(store, model=THINKER) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def rendered(messages, **kwargs):
    """The prompt the template renders, as transformers renders it."""
    return render_jinja_template(
        conversations=[messages], chat_template=THINKING_TEMPLATE, add_generation_prompt=True, **kwargs
    )[0][0]


def raw_reply(client, prompt, seed):
    """The seeded reply's whole text from the legacy completions route (nothing split)."""
    done = client.completions.create(model=THINKER, prompt=prompt, seed=seed, temperature=1.0, max_tokens=MAX_TOKENS)
    return done.choices[0].text


@pytest.fixture(scope="module")
def split(client):
    """A seed whose reply closes its thinking and then answers, with that reply's thinking and
    answer as the raw text says."""
    prompt = rendered(QUESTION)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    for seed in range(400):
        text = raw_reply(client, prompt, seed)
        thinking, closed, answer = text.partition("</think>")
        if closed and thinking.strip(RUST_BLANKS) and answer.strip(RUST_BLANKS) and "<think>" not in thinking:
            return seed, thinking.strip(RUST_BLANKS), answer.lstrip(RUST_BLANKS)
    pytest.fail("no seed of 400 closed its thinking within max_tokens")


def chat(client, seed, **kwargs):
    return client.chat.completions.create(
        model=kwargs.pop("model", THINKER), messages=kwargs.pop("messages", QUESTION), seed=seed,
        temperature=1.0, max_tokens=kwargs.pop("max_tokens", MAX_TOKENS), **kwargs,
    )


def test_the_openai_sdk_reads_reasoning_content_whole_and_streamed(client, split):
    seed, thinking, answer = split
    done = chat(client, seed)
    message = done.choices[0].message
    assert (message.reasoning_content, message.content) == (thinking, answer)
    details = done.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < done.usage.completion_tokens
    pieces = []
    for chunk in chat(client, seed, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        for field in ("reasoning_content", "content"):
            text = getattr(delta, field, None) if delta else None
            if text:
                pieces.append((field, text))
    kinds = [field for field, _ in pieces]
    assert kinds == sorted(kinds, key=lambda k: k == "content"), "all thinking streams before the answer"
    assert kinds.count("reasoning_content") > 1, "the thinking streams in pieces"
    streamed = {field: "".join(t for f, t in pieces if f == field) for field in ("reasoning_content", "content")}
    assert streamed == {"reasoning_content": thinking, "content": answer}


def test_the_library_says_which_model_thinks(server):
    listed = {m["name"]: m["capabilities"] for m in httpx.get(f"{server.url}/app/models", timeout=60).json()}
    assert "thinking" in listed[THINKER] and "completion" in listed[THINKER]
    assert "thinking" not in listed[DEFAULT_MODEL]


def test_requests_turn_thinking_off_where_the_template_can(client, split):
    seed, thinking, _ = split
    off_prompt = rendered(QUESTION, enable_thinking=False)
    assert off_prompt.endswith("<think>\n\n</think>\n\n")
    raw = raw_reply(client, off_prompt, seed)
    for extra in ({"reasoning_effort": "none"}, {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}):
        message = chat(client, seed, **extra).choices[0].message
        assert getattr(message, "reasoning_content", None) is None, extra
        assert message.content == raw, extra
    on = chat(client, seed, reasoning_effort="high").choices[0].message
    assert on.reasoning_content == thinking


def test_a_seeded_thinking_reply_is_the_same_alone_and_batched(client, split):
    seed, thinking, answer = split
    replies, errors = {}, []

    def run(name, seed):
        try:
            replies[name] = chat(client, seed).choices[0].message
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=("pinned", seed))]
    threads += [threading.Thread(target=run, args=(f"other{i}", 1000 + i)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert (replies["pinned"].reasoning_content, replies["pinned"].content) == (thinking, answer)


def test_earlier_turns_thinking_is_left_out_as_the_template_wants(client):
    def prompt_tokens(messages):
        return chat(client, 1, messages=messages, max_tokens=1).usage.prompt_tokens

    answered = {"role": "assistant", "content": "4", "reasoning_content": "two and two"}
    plain = {"role": "assistant", "content": "4"}
    again = {"role": "user", "content": "And 3+3?"}
    # Before the last user message the thinking is dropped; after it (a tool loop) it stays.
    assert prompt_tokens([*QUESTION, answered, again]) == prompt_tokens([*QUESTION, plain, again])
    assert prompt_tokens([*QUESTION, answered]) > prompt_tokens([*QUESTION, plain])


def test_the_responses_api_gives_a_reasoning_item_first(client, split):
    seed, thinking, answer = split
    kwargs = dict(model=THINKER, input=QUESTION[0]["content"], temperature=1.0, max_output_tokens=MAX_TOKENS,
                  extra_body={"seed": seed})
    done = client.responses.create(**kwargs)
    kinds = [item.type for item in done.output]
    assert kinds == ["reasoning", "message"], kinds
    assert done.output[0].content[0].text == thinking
    assert done.output_text == answer
    assert done.usage.output_tokens_details.reasoning_tokens > 0
    deltas = {"response.reasoning_text.delta": "", "response.output_text.delta": ""}
    with client.responses.stream(**kwargs) as stream:
        for event in stream:
            if event.type in deltas:
                deltas[event.type] += event.delta
        final = stream.get_final_response()
    assert deltas == {"response.reasoning_text.delta": thinking, "response.output_text.delta": answer}
    assert [item.type for item in final.output] == ["reasoning", "message"]
    off = client.responses.create(**kwargs, reasoning={"effort": "none"})
    assert [item.type for item in off.output] == ["message"]


def test_the_anthropic_sdk_reads_thinking_blocks(server, split):
    seed, thinking, answer = split
    client = anthropic.Anthropic(base_url=server.base_url.removesuffix("/v1"), api_key="unused", max_retries=0)
    # (This SDK no longer sends `temperature`; the server's default for it is 1.)
    kwargs = dict(model=THINKER, max_tokens=MAX_TOKENS, messages=QUESTION, extra_body={"seed": seed})
    message = client.messages.create(**kwargs)
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert (message.content[0].thinking, message.content[1].text) == (thinking, answer)
    assert message.content[0].signature
    with client.messages.stream(**kwargs) as stream:
        streamed = "".join(e.thinking for e in stream if e.type == "thinking")
        final = stream.get_final_message()
    assert streamed == thinking
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content] == [
        ("thinking", thinking), ("text", answer)
    ]
    # Sent back in a tool loop the thinking block is accepted.
    follow = client.messages.create(**{**kwargs, "max_tokens": 2, "messages": [
        *QUESTION, {"role": "assistant", "content": [block.model_dump() for block in message.content]},
        {"role": "user", "content": "Thanks."}]})
    assert follow.stop_reason == "max_tokens"
    off = client.messages.create(**kwargs, thinking={"type": "disabled"})
    assert [block.type for block in off.content] == ["text"]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(**kwargs, thinking={"type": "enabled", "budget_tokens": MAX_TOKENS})
    assert "budget_tokens" in str(bad.value)


def test_the_ollama_client_reads_message_thinking(server, split):
    seed, thinking, answer = split
    client = ollama.Client(host=server.base_url.removesuffix("/v1"))
    options = {"seed": seed, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "num_predict": MAX_TOKENS}
    done = client.chat(model=THINKER, messages=QUESTION, options=options)
    assert (done.message.thinking, done.message.content) == (thinking, answer)
    pieces = list(client.chat(model=THINKER, messages=QUESTION, options=options, stream=True, think=True))
    assert "".join(p.message.thinking or "" for p in pieces) == thinking
    assert "".join(p.message.content for p in pieces) == answer
    off = client.chat(model=THINKER, messages=QUESTION, options=options, think=False)
    assert off.message.thinking is None
    generated = client.generate(model=THINKER, prompt=QUESTION[0]["content"], options=options)
    assert (generated.thinking, generated.response) == (thinking, answer)
    assert "thinking" in client.show(THINKER).capabilities
    assert "thinking" not in client.show(DEFAULT_MODEL).capabilities
    bad = httpx.post(f"{server.base_url.removesuffix('/v1')}/api/chat", json={
        "model": THINKER, "messages": QUESTION, "think": "extreme", "stream": False})
    assert bad.status_code == 400 and "think" in bad.json()["error"], bad.text


def test_a_model_that_does_not_think_shows_no_reasoning_field(server, client):
    done = chat(client, 3, model=DEFAULT_MODEL, max_tokens=12)
    assert done.choices[0].message.content
    assert "reasoning_content" not in done.choices[0].message.model_dump(exclude_unset=True)
    assert done.usage.completion_tokens_details.reasoning_tokens == 0
    client_o = ollama.Client(host=server.base_url.removesuffix("/v1"))
    reply = client_o.chat(model=DEFAULT_MODEL, messages=QUESTION, options={"seed": 3, "num_predict": 12})
    assert reply.message.thinking is None and reply.message.content
    client_a = anthropic.Anthropic(base_url=server.base_url.removesuffix("/v1"), api_key="unused", max_retries=0)
    message = client_a.messages.create(model=DEFAULT_MODEL, max_tokens=12, messages=QUESTION)
    assert [block.type for block in message.content] == ["text"]


def test_a_bad_reasoning_effort_is_a_400_naming_it(client):
    with pytest.raises(Exception) as bad:
        chat(client, 1, reasoning_effort="huge")
    assert getattr(bad.value, "status_code", None) == 400
    assert bad.value.body["param"] == "reasoning_effort"


def test_the_app_streams_and_stores_a_replys_thinking(server, split):
    seed, thinking, answer = split
    base = server.base_url.removesuffix("/v1")
    settings = {"model": THINKER, "temperature": 1.0, "top_p": 1.0, "max_tokens": MAX_TOKENS, "seed": seed}
    conversation = httpx.post(f"{base}/app/conversations", json={"settings": settings}).json()
    events = []
    with httpx.stream("POST", f"{base}/app/conversations/{conversation['id']}/reply",
                      json={"content": QUESTION[0]["content"]}, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["user", "start"] and kinds[-1] == "done", kinds
    middle = kinds[2:-1]
    assert middle == sorted(middle, key=lambda k: k == "delta"), "thinking streams before the answer"
    assert "".join(e["text"] for e in events if e["type"] == "reasoning") == thinking
    assert "".join(e["text"] for e in events if e["type"] == "delta") == answer
    done = events[-1]["message"]
    assert (done["reasoning"], done["content"]) == (thinking, answer)
    assert isinstance(done["reasoning_ms"], int) and done["reasoning_ms"] >= 0
    stored = httpx.get(f"{base}/app/conversations/{conversation['id']}").json()["messages"][-1]
    assert (stored["reasoning"], stored["reasoning_ms"]) == (thinking, done["reasoning_ms"])
    exported = httpx.get(f"{base}/app/conversations/{conversation['id']}/export?format=markdown").text
    assert "<summary>Thinking</summary>" in exported
