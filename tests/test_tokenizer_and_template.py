"""Tokenizer and chat template against independent references: the GGUF vocabulary rebuilt
with the Python `tokenizers` package (read with the `gguf` package), transformers' own
GGUF byte-level converter, and transformers' Jinja renderer for chat templates (with tools)."""

import json

import pytest
from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
from transformers.utils.chat_template_utils import render_jinja_template

from checkpoints import RICH_TEMPLATE, write_checkpoint
from conftest import DEFAULT_MODEL, default_gguf

TEXTS = [
    "What is the capital of France?",
    "Hello, world! 12345 and 3.14159 — numbers split digit by digit.",
    "  leading spaces,\ttabs\nand\n\nnewlines   ",
    "naïve café, Straße, ½ ¾, Ελληνικά, русский, עברית, العربية",
    "日本語のテキストと中文文本，还有한국어",
    "emoji: 😀🎉👩‍👩‍👧‍👦 🇫🇷 and combining e\u0301",
    "code: fn main() { println!(\"{}\", x >> 2); } // <tag attr='v'>",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "",
    "a" * 300 + " " + "🙂" * 40,
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Émoji? 😀"},
    ],
]


# A Qwen2.5-style template that describes tools itself: the tools listed in the system turn,
# assistant calls as `<tool_call>` blocks, consecutive tool results in one user turn.
TOOLS_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nFunctions you may call, as JSON schemas:\\n<tools>' }}
{%- for tool in tools %}
{{- '\\n' }}{{- tool | tojson }}
{%- endfor %}
{{- '\\n</tools>\\n\\nCall one with <tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city — in °C or °F.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "e.g. \"Zürich\""},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "description": "Local time.", "parameters": {"type": "object", "properties": {}}}},
]

TOOL_CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather and time in Zürich?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {}}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'},
    {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
    {"role": "assistant", "content": "21 °C and clear; it is 14:05."},
    {"role": "user", "content": "Thanks!"},
]


def gguf_fields():
    reader = GGUFReader(str(default_gguf()))

    def field(name):
        return reader.fields[name].contents()

    return field


@pytest.fixture(scope="module")
def reference():
    """SmolLM2's tokenizer as Hugging Face publishes it (digits split one by one, then
    byte-level BPE), rebuilt in Python from the GGUF vocabulary."""
    field = gguf_fields()
    tokens, merges, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.merges"), field("tokenizer.ggml.token_type")
    assert field("tokenizer.ggml.pre") == "smollm"
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    return tok


@pytest.fixture(scope="module")
def probed(seedbar, tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    (d / "texts.json").write_text(json.dumps(TEXTS))
    (d / "chats.json").write_text(json.dumps(CHATS))
    return seedbar.probe(DEFAULT_MODEL, texts=str(d / "texts.json"), chats=str(d / "chats.json"))


def test_encoding_matches_the_python_reference(probed, reference):
    for text, ids in zip(TEXTS, probed["encoded"]):
        assert ids == reference.encode(text, add_special_tokens=False).ids, text


def test_encoding_matches_transformers_gguf_converter_without_digits(probed):
    """transformers' converter does not know SmolLM's digit split, so compare digit-free texts."""
    field = gguf_fields()
    tokenizer_dict = {
        "tokenizer_type": "gpt2",
        "pre_tokenizer_type": "smollm",
        "tokens": field("tokenizer.ggml.tokens"),
        "merges": field("tokenizer.ggml.merges"),
        "token_type": field("tokenizer.ggml.token_type"),
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    converted, _ = convert_gguf_tokenizer("llama", tokenizer_dict)
    checked = 0
    for text, ids in zip(TEXTS, probed["encoded"]):
        if not any(c.isnumeric() for c in text):
            assert ids == converted.encode(text, add_special_tokens=False).ids, text
            checked += 1
    assert checked >= 5


def test_round_trip_and_streaming_reproduce_the_text(probed):
    for text, decoded, pieces in zip(TEXTS, probed["decoded"], probed["streamed"]):
        if "<|im_start|>" not in text:  # special tokens are left out of decoded replies
            assert decoded == text
        assert "".join(pieces) == decoded
        # Never a replacement character from a split multi-byte sequence.
        assert all("\ufffd" not in p for p in pieces)
    emoji = TEXTS.index(next(t for t in TEXTS if t.startswith("emoji")))
    # Multi-byte characters span several byte tokens: some pushes must have been held back.
    assert "" in probed["streamed"][emoji][:-1]


def test_chat_template_matches_transformers(probed):
    template = gguf_fields()("tokenizer.chat_template")
    expected, _ = render_jinja_template(conversations=CHATS, chat_template=template, add_generation_prompt=True)
    assert probed["rendered"] == expected
    assert probed["rendered"][0].endswith("<|im_start|>assistant\n")


def test_rich_template_matches_transformers(seedbar, tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", "qwen3")
    chats = [
        [{"role": "system", "content": "  be brief "}, {"role": "user", "content": "/shout this"}, {"role": "assistant", "content": "OK"}, {"role": "user", "content": "and \"quotes\" ü"}],
        [{"role": "user", "content": "one"}],
    ]
    (tmp_path / "chats.json").write_text(json.dumps(chats))
    ours = seedbar.probe(str(path), chats=str(tmp_path / "chats.json"))["rendered"]
    expected, _ = render_jinja_template(conversations=chats, chat_template=RICH_TEMPLATE, add_generation_prompt=True)
    assert ours == expected
    assert '{"n": 4, "tags": ["a", "b"]}' in ours[0]


def test_raise_exception_reaches_the_user(seedbar, tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", "llama")
    (tmp_path / "chats.json").write_text(json.dumps([[{"role": "assistant", "content": "x"}]]))
    proc = seedbar.run("probe", "--model", path, "--chats", tmp_path / "chats.json", check=False)
    assert proc.returncode == 1
    assert "first message must be system or user" in proc.stderr
    assert "panicked" not in proc.stderr


def test_tools_template_matches_transformers(seedbar, tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", "qwen2")
    (path / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    chats = [
        {"messages": TOOL_CONVERSATION, "tools": TOOLS},
        {"messages": TOOL_CONVERSATION[1:3], "tools": TOOLS[:1]},
        TOOL_CONVERSATION,  # no tools: the template's other branch
    ]
    (tmp_path / "chats.json").write_text(json.dumps(chats))
    ours = seedbar.probe(str(path), chats=str(tmp_path / "chats.json"))["rendered"]
    expected = [
        render_jinja_template(
            conversations=[chat["messages"]], tools=chat["tools"], chat_template=TOOLS_TEMPLATE, add_generation_prompt=True
        )[0][0]
        for chat in chats[:2]
    ]
    expected += render_jinja_template(conversations=[chats[2]], chat_template=TOOLS_TEMPLATE, add_generation_prompt=True)[0]
    assert ours == expected
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}\n</tool_call>' in ours[0]
    assert "<|im_start|>user\n<tool_response>\n" in ours[0] and "</tool_response>\n<tool_response>" in ours[0]
    assert "<tools>" not in ours[2]


def test_template_without_tools_gets_them_in_its_system_message(seedbar, tmp_path):
    template = gguf_fields()("tokenizer.chat_template")
    assert "tools" not in template
    chats = [{"messages": TOOL_CONVERSATION, "tools": TOOLS}, {"messages": TOOL_CONVERSATION[1:2], "tools": TOOLS}]
    (tmp_path / "chats.json").write_text(json.dumps(chats))
    with_system, without_system = seedbar.probe(DEFAULT_MODEL, chats=str(tmp_path / "chats.json"))["rendered"]
    for rendered in (with_system, without_system):
        system = rendered.split("<|im_end|>")[0]
        assert system.startswith("<|im_start|>system\n")
        assert rendered.count("<|im_start|>system") == 1
        assert "<tools>\n" + json.dumps(TOOLS[0], ensure_ascii=False) in system
        assert "get_time" in system and "<tool_call>" in system
    assert with_system.startswith("<|im_start|>system\nYou are terse.\n\n")
    assert "SmolLM" not in without_system  # the template's default system prompt is replaced
    # Earlier calls and results are spelled out the way the model is told to write them.
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}\n</tool_call>' in with_system
    assert "<|im_start|>user\n<tool_response>\n14:05" not in with_system
    assert '<tool_response>\n{"temperature": 21, "sky": "clear"}\n</tool_response>\n<tool_response>\n14:05\n</tool_response><|im_end|>' in with_system
