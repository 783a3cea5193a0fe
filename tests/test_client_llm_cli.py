"""The `llm` CLI against the real server and SmolLM2, configured as its users do: an
`extra-openai-models.yaml` in its user folder naming the server's base URL, once through Chat
Completions and once through the Responses API. A prompt answers (streamed and not), `-o
json_object 1` gives valid JSON, `--schema` gives an object matching the schema."""

import json
import subprocess
import sys

import pytest

from conftest import DEFAULT_MODEL

CHAT = "seedbar"
RESPONSES = "seedbar-responses"
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm(server, tmp_path_factory):
    user_path = tmp_path_factory.mktemp("llm-user")
    (user_path / "extra-openai-models.yaml").write_text(
        f"""- model_id: {CHAT}
  model_name: {DEFAULT_MODEL}
  api_base: {server.base_url}
  supports_schema: true
- model_id: {RESPONSES}
  model_name: {DEFAULT_MODEL}
  api_base: {server.base_url}
  supports_schema: true
  responses: true
"""
    )
    env = {"LLM_USER_PATH": str(user_path), "PATH": "/usr/bin:/bin", "HOME": str(user_path)}

    def run(*args):
        proc = subprocess.run(
            [sys.executable, "-m", "llm", *args], capture_output=True, text=True, timeout=120, env=env
        )
        assert proc.returncode == 0, f"llm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}"
        return proc.stdout

    return run


# Each reply pinned: seeded, or greedy where the openai SDK's `responses.create` takes no `seed`.
PINNED = [(CHAT, ["-o", "seed", "5"]), (RESPONSES, ["-o", "temperature", "0"])]


@pytest.mark.parametrize("model, pin", PINNED)
def test_a_prompt_answers_the_same_streamed_or_not(llm, model, pin):
    args = ["-m", model, "-o", "max_tokens", "16", *pin, "--no-log", "Say hello."]
    streamed = llm("prompt", *args)
    assert streamed.strip()
    assert llm("prompt", "--no-stream", *args) == streamed, "a seeded reply is reproducible"


@pytest.mark.parametrize("model, pin", PINNED)
def test_json_object_option_gives_valid_json(llm, model, pin):
    # Greedy: a sampled object of a 135M model may not close within the tokens allowed.
    greedy = ["-o", "temperature", "0"]
    out = llm("prompt", "-m", model, "-o", "json_object", "1", "-o", "max_tokens", "60", *pin, *greedy, "--no-log",
              'What is a good name for a cat? Answer as JSON like {"name": "..."}.')
    assert isinstance(json.loads(out), dict)


@pytest.mark.parametrize("model, pin", PINNED)
def test_a_schema_gives_an_object_matching_it(llm, model, pin):
    out = llm("prompt", "-m", model, "--schema", json.dumps(PERSON), "-o", "max_tokens", "40", *pin, "--no-log",
              "Invent a person.")
    person = json.loads(out)
    assert set(person) == {"name", "age"}, person
    assert isinstance(person["name"], str) and len(person["name"]) <= 20 and isinstance(person["age"], int)
