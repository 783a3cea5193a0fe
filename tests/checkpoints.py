"""Small random-weight checkpoints written with mlx-lm's own model classes, so Seedbar's
loaders and architectures can be checked against mlx-lm on identical weights."""

import importlib
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

VOCAB = 256

BASE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=160,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=VOCAB,
    rope_theta=10000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
    eos_token_id=VOCAB - 1,
    bos_token_id=VOCAB - 2,
)

ARCHITECTURES = {
    "llama": dict(model_type="llama"),
    "llama3": dict(
        model_type="llama",
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    "mistral": dict(model_type="mistral", num_key_value_heads=1),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", head_dim=32),
    # Window 8 with a 12-token prompt: sliding layers (0 and 2) mask inside the prefill and
    # their decode runs past the window; sqrt(96) is not a bfloat16, so the embedding
    # scale's rounding shows.
    "gemma3": dict(
        model_type="gemma3_text",
        hidden_size=96,
        num_hidden_layers=3,
        head_dim=32,
        query_pre_attn_scalar=48,
        rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0,
        sliding_window=8,
        sliding_window_pattern=2,
    ),
    "gemma2": dict(
        model_type="gemma2",
        head_dim=32,
        query_pre_attn_scalar=24,
        attn_logit_softcapping=20.0,
        final_logit_softcapping=60.0,
        tie_word_embeddings=True,
    ),
    "phi3": dict(model_type="phi3"),
    # Long-rope on half of each head's dimensions, past its original context of 64.
    "phi3_longrope": dict(
        model_type="phi3",
        partial_rotary_factor=0.5,
        original_max_position_embeddings=64,
        rope_scaling=dict(
            type="longrope",
            long_factor=[1.0, 1.5, 2.0, 4.0],
            short_factor=[1.0, 1.0, 1.0, 1.0],
        ),
    ),
    "smollm3": dict(model_type="smollm3", no_rope_layers=[1, 0]),
    # Gemma 3 as llama.cpp reads a GGUF of it: every sixth layer global, a local RoPE base
    # of 10000, a query scale of 1/sqrt(head_dim).
    "gemma3_gguf": dict(
        model_type="gemma3_text",
        num_hidden_layers=6,
        head_dim=32,
        query_pre_attn_scalar=32,
        rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0,
        sliding_window=8,
        sliding_window_pattern=6,
    ),
    # Gemma 2 as llama.cpp reads a GGUF of it: a query scale of 1/sqrt(head_dim); a window
    # of 8 on the alternate layers, shorter than the 12-token prompt.
    "gemma2_gguf": dict(
        model_type="gemma2",
        head_dim=32,
        query_pre_attn_scalar=32,
        sliding_window=8,
        attn_logit_softcapping=20.0,
        final_logit_softcapping=60.0,
        tie_word_embeddings=True,
    ),
    # Three layers, the middle one a dense MLP; 8 experts, 2 per token.
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        num_hidden_layers=3,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=96,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        norm_topk_prob=True,
    ),
    "qwen3_moe_unnormalized": dict(
        model_type="qwen3_moe",
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=96,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=False,
    ),
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, rope_theta=1_000_000.0),
}
# Qwen3-MoE as llama.cpp reads a GGUF of it: every layer routed, the chosen experts' weights
# renormalized.
ARCHITECTURES["qwen3_moe_gguf"] = {**ARCHITECTURES["qwen3_moe_unnormalized"], "norm_topk_prob": True}

# A Qwen-style template exercising what Hugging Face templates use: namespaces, loop
# variables, Python string methods, tojson, raise_exception.
RICH_TEMPLATE = """{%- if messages[0].role != 'system' and messages[0].role != 'user' %}{{ raise_exception('first message must be system or user') }}{% endif -%}
{%- set ns = namespace(last_user=0) -%}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor -%}
{%- for message in messages %}
<|im_start|>{{ message.role }}
{% if message.content.startswith('/') %}{{ message.content[1:].strip().upper() }}{% else %}{{ message.content.strip() }}{% endif %}
{%- if loop.index0 == ns.last_user %} [last user turn; meta={{ {'n': loop.length, 'tags': ['a', 'b']} | tojson }}]{% endif %}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"""


# A Qwen3-style template that thinks: the reply opens inside `<think>` (as DeepSeek-R1
# distills and Qwen3's thinking models do), `enable_thinking=false` closes it empty first, and
# earlier turns' thinking is left out (the reasoning of a turn after the last user message,
# e.g. before a tool call, is kept).
THINKING_TEMPLATE = """{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor -%}
{%- for message in messages %}
{%- if message.role == 'assistant' %}
{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
<|im_start|>assistant
{% if message.reasoning_content and loop.index0 > ns.last_user %}<think>
{{ message.reasoning_content.strip('\\n') }}
</think>

{% endif %}{{ content }}<|im_end|>
{% else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif %}{% endif -%}"""

# Added (not special) tokens of a thinking checkpoint, ids 256 and 257 as in Qwen3's vocabulary
# they are ordinary added tokens that decode to their text.
THINK_TOKENS = ["<think>", "</think>"]


def byte_tokenizer() -> Tokenizer:
    """Byte-level BPE whose 256 tokens are the 256 bytes (no merges)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = {}
    # Same byte->char table as GPT-2's bytes_to_unicode.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    extra = 0
    for b in range(256):
        if b in printable:
            byte_to_char[b] = chr(b)
        else:
            byte_to_char[b] = chr(256 + extra)
            extra += 1
    assert set(byte_to_char.values()) == set(alphabet)
    vocab = {byte_to_char[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


# Fill-in-the-middle special tokens (StarCoder naming), given ids after the 256 bytes.
FIM_TOKENS = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]


def write_checkpoint(
    directory: Path, arch: str, quantize_bits=None, dtype=None, seed=0, fim=False, overrides=None, thinking=False
) -> Path:
    """A random-weight checkpoint of `arch` in `directory`, loadable by mlx-lm and Seedbar.
    With `fim`, the vocabulary also holds FIM_TOKENS (ids 256, 257, 258); with `thinking`, it
    holds THINK_TOKENS (ids 256, 257) and its template is THINKING_TEMPLATE; `overrides`
    replace config values (a wider `vocab_size` keeps the tokenizer's 256 tokens)."""
    assert not (fim and thinking), "one set of added tokens"
    config = {**BASE, **ARCHITECTURES[arch], **(overrides or {})}
    if fim:
        config["vocab_size"] = VOCAB + len(FIM_TOKENS)
    if thinking:
        config["vocab_size"] = VOCAB + len(THINK_TOKENS)
    module_name = {"mistral": "llama"}.get(config["model_type"], config["model_type"])
    module = importlib.import_module(f"mlx_lm.models.{module_name}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    # Wider weights than the default init so logits are well separated and greedy
    # continuations do not hinge on ties.
    gemma = config["model_type"].startswith("gemma")
    model.update(tree_map(lambda p: p * 3.0 if p.ndim >= 2 else p, model.parameters()))
    if gemma:
        # Gemma scales embeddings by sqrt(d) and its norms by 1 + w (w starts at 1): keep the
        # embeddings at their initial size and draw small w, so the input token does not
        # drown the layers (the tied head would then repeat it) and the offset shows.
        model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.1 if p.ndim == 1 else p, model.parameters()))
        embed = model.model.embed_tokens
        embed.weight = embed.weight / 3.0
    if quantize_bits:
        nn.quantize(model, group_size=32, bits=quantize_bits)
        config["quantization"] = {"group_size": 32, "bits": quantize_bits}
    weights = dict(tree_flatten(model.parameters()))
    if dtype is not None:
        weights = {k: (v.astype(dtype) if v.dtype == mx.float32 else v) for k, v in weights.items()}
    directory.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(directory / "model.safetensors"), weights, metadata={"format": "mlx"})
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer = byte_tokenizer()
    if fim:
        tokenizer.add_special_tokens(FIM_TOKENS)
    if thinking:
        tokenizer.add_tokens(THINK_TOKENS)
    tokenizer.save(str(directory / "tokenizer.json"))
    template = THINKING_TEMPLATE if thinking else RICH_TEMPLATE
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"})
    )
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [VOCAB - 1]}))
    return directory
