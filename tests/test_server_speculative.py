"""Speculative decoding through the real `openai` SDK: a seeded reply is the same with prompt
lookup on (the default) and off (`"speculative": false`), for an editor's request sampled with
filters and penalties, under a JSON schema and with a forced tool call; `/metrics` counts the
drafted and kept tokens; `seedbar serve --no-speculative` drafts nothing; a wrong
`speculative` value is a 400 in OpenAI's error shape. With a draft model (`--draft-model`),
the same for chat replies that prompt lookup has little to draft for, alone and batched; a
draft model of another vocabulary is refused, and the model serves without one."""

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


# ---------------------------------------------------------------------------------------------
# A draft model (`seedbar serve --draft-model`): the target is SmolLM2 with twice its blocks, the
# added ones adding nothing to its residual stream (tests/gguf_checkpoints.py's
# `write_deeper_gguf`): twice the cost of a step, and the same logits, so SmolLM2 itself drafts
# for it as a well-matched small model of the family would.

DEEP = "SmolLM2-deeper"
CHAT = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def drafting(tmp_path_factory):
    from conftest import Seedbar, default_gguf
    from gguf_checkpoints import write_deeper_gguf

    root = tmp_path_factory.mktemp("drafting")
    store = Seedbar(root / "home")
    store.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    store.run("models", "add", write_deeper_gguf(Path(default_gguf()), root / f"{DEEP}.gguf", 2), "--name", DEEP)
    with serving(store, "--draft-model", DEFAULT_MODEL, "--prompt-cache-disk-gb", "0", model=DEEP) as srv:
        yield store, srv


def test_a_draft_models_drafts_never_change_a_reply(drafting):
    from concurrent.futures import ThreadPoolExecutor

    _, srv = drafting
    client = OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
    before = srv.metrics()
    cases = [{"temperature": 0}, {"temperature": 0.7, "top_p": 0.9, "frequency_penalty": 0.2},
             {"temperature": 1.2, "extra_body": {"min_p": 0.05, "top_k": 40}}]
    for sampling in cases:
        on, off = both(client, model=DEEP, messages=CHAT, max_tokens=96, **sampling)
        assert on.content and on.content == off.content, sampling
    drafted = srv.metrics()["seedbar_model_drafted_tokens_total"] - before.get("seedbar_model_drafted_tokens_total", 0)
    assert drafted > 0, "the draft model drafted"
    # Batched with others (chats and editor requests, some not speculating), and under an
    # output format and a forced tool call.
    expected = both(client, model=DEEP, messages=CHAT, max_tokens=96, temperature=0)[1].content
    sibling = lambda k: client.chat.completions.create(
        model=DEEP, messages=[{"role": "user", "content": f"Describe the number {k}."}], seed=k, temperature=0.8,
        max_tokens=32, extra_body={"speculative": k % 3 != 0})
    with ThreadPoolExecutor(8) as pool:
        rest = [pool.submit(sibling, k) for k in range(7)]
        mine = pool.submit(lambda: client.chat.completions.create(model=DEEP, messages=CHAT, seed=11, temperature=0, max_tokens=96))
        [r.result() for r in rest]
    assert mine.result().choices[0].message.content == expected, "among 7 others"
    schema = {"type": "object", "properties": {"story": {"type": "string", "maxLength": 200}},
              "required": ["story"], "additionalProperties": False}
    on, off = both(client, model=DEEP, messages=CHAT, max_tokens=120, temperature=0.7,
                   response_format={"type": "json_schema", "json_schema": {"name": "story", "schema": schema}})
    assert on.content == off.content and on.content.startswith("{")
    forced = {"type": "function", "function": {"name": "read_file"}}
    on, off = both(client, model=DEEP, messages=CHAT, max_tokens=48, temperature=0.7, tools=[READ_FILE], tool_choice=forced)
    assert on.tool_calls[0].function.arguments == off.tool_calls[0].function.arguments


def test_a_draft_model_of_another_vocabulary_is_refused_and_the_model_serves_without(drafting, tmp_path):
    from checkpoints import write_checkpoint
    from gguf_checkpoints import write_gguf

    store, _ = drafting
    other = write_gguf(write_checkpoint(tmp_path / "other", "llama"), tmp_path / "bytes.gguf")
    with serving(store, "--draft-model", str(other), "--prompt-cache-disk-gb", "0", model=DEEP) as srv:
        client = OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
        assert client.chat.completions.create(model=DEEP, messages=CHAT, max_tokens=8, seed=1).choices[0].message.content
        assert srv.metrics()["seedbar_model_drafted_tokens_total"] == 0
        assert "cannot draft for" in srv.stderr() and "vocabularies differ" in srv.stderr()


def test_the_settings_choose_a_models_draft_model(drafting):
    """`draft_models` in the app settings (the library's choice): checked when saved, used
    from the model's next request on, and dropped again."""
    import httpx

    store, _ = drafting
    with serving(store, "--prompt-cache-disk-gb", "0", model=DEEP) as srv, httpx.Client(base_url=srv.url, timeout=300) as app:
        client = OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
        reply = lambda: client.chat.completions.create(model=DEEP, messages=CHAT, max_tokens=48, seed=4, temperature=0)
        plain = reply().choices[0].message.content
        assert srv.metrics()["seedbar_model_drafted_tokens_total"] == 0
        settings = app.get("/app/settings").json()
        assert settings["draft_models"] == {}
        for pairs, param in [({DEEP: "no-such-model"}, f"draft_models.{DEEP}"), ({DEEP: DEEP}, f"draft_models.{DEEP}")]:
            refused = app.put("/app/settings", json={**settings, "draft_models": pairs})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
        saved = app.put("/app/settings", json={**settings, "draft_models": {DEEP.lower(): DEFAULT_MODEL}})
        assert saved.status_code == 200 and saved.json()["draft_models"] == {DEEP: DEFAULT_MODEL}, saved.text
        assert reply().choices[0].message.content == plain
        assert srv.metrics()["seedbar_model_drafted_tokens_total"] > 0, "drafted from the next request on"
        assert app.put("/app/settings", json={**settings, "draft_models": {}}).status_code == 200
