"""`seedbar serve` through the official `openai` Python SDK: models, chat and legacy completions
(streamed and not), seeds that reproduce a reply, stop sequences, logprobs, n, errors mapped to
the SDK's exceptions, and concurrent streams that each give exactly their solo text."""

import asyncio

import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from conftest import DEFAULT_MODEL, serving

QUESTION = "What is the capital of France? Answer in one sentence."
POEM = "Write a short poem about the sea."
EOS_BAN = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|>: forces max_tokens tokens


def user(text):
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def client(server):
    # No retries: a 429/5xx must surface, not be retried away.
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def chat(client, text, **kwargs):
    kwargs.setdefault("max_tokens", 32)
    return client.chat.completions.create(model=DEFAULT_MODEL, messages=user(text), **kwargs)


def chat_text(client, text, **kwargs):
    return chat(client, text, **kwargs).choices[0].message.content


def seed_of(obj):
    extra = obj.model_extra or {}
    assert "seed" in extra, f"no top-level `seed` in {obj!r}"
    assert isinstance(extra["seed"], int), extra["seed"]
    return extra["seed"]


def test_ready_line_names_the_model(server):
    assert server.model == DEFAULT_MODEL
    assert server.ready_line == f"Seedbar serving {DEFAULT_MODEL} at http://127.0.0.1:{server.port}/v1"


def test_models_list(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [DEFAULT_MODEL]
    model = models.data[0]
    assert model.object == "model"
    assert model.owned_by == "seedbar"
    assert isinstance(model.created, int)


def test_chat_answers_paris_with_openai_fields(client):
    completion = chat(client, QUESTION, temperature=0, max_tokens=32)
    assert completion.object == "chat.completion"
    assert completion.id and isinstance(completion.created, int) and completion.created > 0
    assert completion.model == DEFAULT_MODEL
    assert completion.system_fingerprint
    seed_of(completion)
    assert len(completion.choices) == 1
    choice = completion.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content, choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage.prompt_tokens > 5
    assert 0 < usage.completion_tokens <= 32
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_chat_accepts_text_parts_content_and_unknown_fields(client):
    plain = chat_text(client, QUESTION, temperature=0, max_tokens=16)
    parts = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
        temperature=0,
        max_completion_tokens=16,
        user="pytest",
        extra_body={"some_future_field": {"x": 1}},
    )
    assert parts.choices[0].message.content == plain
    assert parts.usage.completion_tokens <= 16


def test_chat_accepts_tools_and_tool_choice(client):
    tools = [{
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city",
                     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
    }]
    completion = chat(client, QUESTION, temperature=0, max_tokens=16, tools=tools, tool_choice="auto")
    assert completion.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_chat_stream_matches_non_stream_and_reports_usage(client):
    whole = chat(client, POEM, temperature=0, max_tokens=32)
    stream = chat(client, POEM, temperature=0, max_tokens=32, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    choice_chunks = [c for c in chunks if c.choices]
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert choice_chunks and usage_chunks
    assert choice_chunks[0].choices[0].delta.role == "assistant"
    for chunk in chunks:
        assert chunk.object == "chat.completion.chunk"
        assert chunk.id == chunks[0].id
        assert chunk.model == DEFAULT_MODEL
        assert chunk.system_fingerprint
        assert isinstance(chunk.created, int)
        assert seed_of(chunk) == seed_of(chunks[0])
    # finish_reason stays null until the last choice chunk.
    assert all(c.choices[0].finish_reason is None for c in choice_chunks[:-1])
    assert choice_chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in choice_chunks)
    assert text == whole.choices[0].message.content
    # The usage chunk comes last, with no choices.
    assert chunks[-1] is usage_chunks[-1] and len(usage_chunks) == 1
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage.completion_tokens == whole.usage.completion_tokens == 32
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_stream_without_include_usage_has_no_usage_chunk(client):
    chunks = list(chat(client, QUESTION, temperature=0, max_tokens=8, stream=True))
    assert chunks and all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_same_seed_same_text_different_seeds_differ(client):
    kwargs = dict(temperature=0.8, max_tokens=32)
    first = chat(client, POEM, seed=1234, **kwargs)
    second = chat(client, POEM, seed=1234, **kwargs)
    assert seed_of(first) == seed_of(second) == 1234
    assert first.choices[0].message.content == second.choices[0].message.content
    one = chat_text(client, POEM, seed=1, **kwargs)
    two = chat_text(client, POEM, seed=2, **kwargs)
    assert one != two
    assert len(first.choices[0].message.content.split()) > 5


def test_unseeded_reply_reports_the_seed_that_reproduces_it(client):
    kwargs = dict(model=DEFAULT_MODEL, messages=user(POEM), temperature=0.8, max_tokens=24)
    raw = client.chat.completions.with_raw_response.create(**kwargs)
    header = raw.headers.get("x-seedbar-seed")
    assert header is not None, dict(raw.headers)
    completion = raw.parse()
    assert seed_of(completion) == int(header)
    again = client.chat.completions.create(seed=int(header), **kwargs)
    assert again.choices[0].message.content == completion.choices[0].message.content
    # Seeds are drawn at random, not fixed.
    other = client.chat.completions.with_raw_response.create(**kwargs)
    assert int(other.headers["x-seedbar-seed"]) != int(header)


def test_streamed_unseeded_reply_reports_the_seed_that_reproduces_it(client):
    chunks = list(chat(client, POEM, temperature=0.8, max_tokens=24, stream=True))
    seed = seed_of(chunks[0])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chat_text(client, POEM, temperature=0.8, max_tokens=24, seed=seed) == text


def test_legacy_completion(client):
    prompt = "The capital of France is"
    completion = client.completions.create(model=DEFAULT_MODEL, prompt=prompt, max_tokens=16, temperature=0)
    assert completion.object == "text_completion"
    assert completion.model == DEFAULT_MODEL
    assert completion.id and completion.system_fingerprint
    seed_of(completion)
    text = completion.choices[0].text
    assert text.strip()
    assert not text.startswith(prompt)
    assert 0 < completion.usage.completion_tokens <= 16
    echoed = client.completions.create(model=DEFAULT_MODEL, prompt=prompt, max_tokens=16, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + text


def test_legacy_completion_prompt_list(client):
    prompts = ["The capital of France is", "One, two, three,"]
    completion = client.completions.create(model=DEFAULT_MODEL, prompt=prompts, max_tokens=8, temperature=0)
    assert sorted(c.index for c in completion.choices) == [0, 1]
    by_index = {c.index: c.text for c in completion.choices}
    for i, prompt in enumerate(prompts):
        alone = client.completions.create(model=DEFAULT_MODEL, prompt=prompt, max_tokens=8, temperature=0)
        assert by_index[i] == alone.choices[0].text


def test_legacy_completion_logprobs_shape(client):
    prompt = "The capital of France is"
    completion = client.completions.create(
        model=DEFAULT_MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=2
    )
    choice = completion.choices[0]
    lp = choice.logprobs
    assert lp is not None
    n = completion.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert "".join(lp.tokens) == choice.text
    assert all(v <= 0 for v in lp.token_logprobs)
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 2, top
        assert all(v <= 0 for v in top.values())
        # Greedy: the chosen token is the most likely one.
        assert token in top and top[token] == pytest.approx(max(top.values()), abs=1e-4)
        assert logprob == pytest.approx(top[token], abs=1e-4)
    for i in range(n - 1):
        assert lp.text_offset[i + 1] - lp.text_offset[i] == len(lp.tokens[i])


def test_legacy_completion_suffix_needs_fim_tokens(client):
    # This SmolLM2 GGUF's vocabulary has no <fim_prefix>/<fim_suffix>/<fim_middle>, so `suffix`
    # is refused (the fill-in-the-middle path itself is covered in test_server_http.py).
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(
            model=DEFAULT_MODEL, prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n",
            max_tokens=16, temperature=0,
        )
    assert info.value.param == "suffix", info.value.body
    assert "fill-in-the-middle" in info.value.body["message"] or "suffix" in info.value.body["message"]


def test_stop_sequences_cut_the_reply(client):
    kwargs = dict(temperature=0, max_tokens=32)
    full = chat_text(client, POEM, **kwargs)
    words = full.split()
    assert len(words) >= 6, full
    stop = " " + words[len(words) // 2]
    assert full.count(stop) >= 1
    expected = full[: full.index(stop)]
    for stop_param in (stop, ["never-appears-zzz", stop]):
        completion = chat(client, POEM, stop=stop_param, **kwargs)
        text = completion.choices[0].message.content
        assert stop not in text
        assert text == expected
        assert completion.choices[0].finish_reason == "stop"
    # Streamed, the stop string never leaks out either.
    chunks = list(chat(client, POEM, stop=stop, stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_legacy_completion_stop(client):
    prompt = "Count: one, two, three, four, five,"
    full = client.completions.create(model=DEFAULT_MODEL, prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    stop = ","
    assert stop in full, full
    cut = client.completions.create(model=DEFAULT_MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=stop)
    assert cut.choices[0].text == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_chat_logprobs(client):
    completion = chat(client, QUESTION, temperature=0, max_tokens=16, logprobs=True, top_logprobs=3)
    choice = completion.choices[0]
    content = choice.logprobs.content
    assert len(content) == completion.usage.completion_tokens
    assert "".join(entry.token for entry in content) == choice.message.content
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert all(top.logprob <= 0 for top in entry.top_logprobs)
        tops = [top.logprob for top in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # Greedy: the chosen token is the top one.
        assert entry.logprob == pytest.approx(tops[0], abs=1e-4)
        assert entry.token == entry.top_logprobs[0].token


def test_n_choices_with_seed(client):
    kwargs = dict(temperature=0.8, max_tokens=24, n=2, seed=77, logit_bias=EOS_BAN)
    first = chat(client, POEM, **kwargs)
    assert seed_of(first) == 77
    assert sorted(c.index for c in first.choices) == [0, 1]
    texts = [c.message.content for c in sorted(first.choices, key=lambda c: c.index)]
    assert all(texts)
    assert texts[0] != texts[1], "n=2 gave two identical samples"
    assert all(c.finish_reason == "length" for c in first.choices)
    # Usage adds up both choices.
    assert first.usage.completion_tokens == 2 * 24
    second = chat(client, POEM, **kwargs)
    assert [c.message.content for c in sorted(second.choices, key=lambda c: c.index)] == texts


def test_penalties_and_logit_bias_change_the_reply(client):
    base = chat(client, POEM, temperature=0, max_tokens=24)
    banned = chat(client, POEM, temperature=0, max_tokens=24, logit_bias=EOS_BAN)
    assert banned.usage.completion_tokens == 24
    penalised = chat(client, POEM, temperature=0, max_tokens=24, presence_penalty=2.0, frequency_penalty=2.0)
    assert penalised.choices[0].message.content != base.choices[0].message.content


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=user(QUESTION), max_tokens=4)
    assert info.value.status_code == 404
    assert isinstance(info.value.body, dict) and info.value.body.get("message")
    assert "no-such-model" in info.value.body["message"]


def test_bad_temperature_is_bad_request(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=DEFAULT_MODEL, messages=user(QUESTION), max_tokens=4, temperature=-1)
    err = info.value
    assert err.status_code == 400
    assert err.param == "temperature", err.body
    assert "temperature" in err.body["message"]
    assert err.body.get("type")


def test_unknown_model_on_legacy_completions(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=4)


@pytest.fixture(scope="module")
def keyed_server(seedbar):
    # The key from the environment (the `--api-key` flag is covered in test_server_http.py).
    with serving(seedbar, env={"SEEDBAR_API_KEY": "sk-test-key"}) as srv:
        yield srv


def test_wrong_key_is_authentication_error(keyed_server):
    wrong = OpenAI(base_url=keyed_server.base_url, api_key="sk-wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as info:
        wrong.models.list()
    assert info.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=DEFAULT_MODEL, messages=user(QUESTION), max_tokens=4)
    right = OpenAI(base_url=keyed_server.base_url, api_key="sk-test-key", max_retries=0, timeout=60)
    assert [m.id for m in right.models.list().data] == [DEFAULT_MODEL]
    assert right.chat.completions.create(
        model=DEFAULT_MODEL, messages=user(QUESTION), max_tokens=4, temperature=0
    ).choices[0].message.content


# --- concurrency ---------------------------------------------------------------------------

CONCURRENT = [
    ("Write a haiku about autumn leaves.", 11),
    ("Tell me a fact about elephants.", 22),
    ("Describe a rainy day in London.", 33),
    ("Give me a name for a pet turtle.", 44),
    ("What should I cook for dinner tonight?", 55),
    ("Write one sentence about the moon.", 66),
    ("Why is the sky blue?", 77),
    ("Invent a new ice cream flavor.", 88),
]


async def stream_text(aclient, prompt, seed):
    stream = await aclient.chat.completions.create(
        model=DEFAULT_MODEL, messages=user(prompt), temperature=0.8, max_tokens=32, seed=seed, stream=True
    )
    parts, finish = [], None
    async for chunk in stream:
        assert seed_of(chunk) == seed
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert finish in ("stop", "length")
    return "".join(parts)


def test_concurrent_streams_give_their_solo_text(server):
    async def main():
        aclient = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=180)
        alone = [await stream_text(aclient, p, s) for p, s in CONCURRENT]
        again = await stream_text(aclient, *CONCURRENT[0])
        together = await asyncio.gather(*(stream_text(aclient, p, s) for p, s in CONCURRENT))
        together_again = await asyncio.gather(*(stream_text(aclient, p, s) for p, s in reversed(CONCURRENT)))
        await aclient.close()
        return alone, again, together, list(reversed(together_again))

    alone, again, together, together_again = asyncio.run(main())
    assert all(alone)
    assert again == alone[0]
    assert len(set(alone)) == len(alone)
    for (prompt, seed), solo, conc, conc2 in zip(CONCURRENT, alone, together, together_again):
        assert conc == solo, f"{prompt!r} seed {seed}: concurrent text differs from solo"
        assert conc2 == solo, f"{prompt!r} seed {seed}: second concurrent text differs from solo"
