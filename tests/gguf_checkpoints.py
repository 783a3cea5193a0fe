"""Random-weight GGUF files written with the `gguf` package from the safetensors checkpoints
of checkpoints.py, laid out as llama.cpp's converter lays them out (tensor names from the
package's own name map, llama's q/k rows permuted for interleaved RoPE, Gemma's norms
stored as 1 + w, experts stacked as `ffn_*_exps` with their counts in the metadata), with
a byte-level BPE or a SentencePiece vocabulary."""

import json
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np

# The GGUF architecture each checkpoint model_type is written as (Mistral's and Mixtral's
# are llama).
GGUF_ARCH = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "mistral": gguf.MODEL_ARCH.LLAMA,
    "mixtral": gguf.MODEL_ARCH.LLAMA,
    "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE,
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "gemma2": gguf.MODEL_ARCH.GEMMA2,
    "gemma3_text": gguf.MODEL_ARCH.GEMMA3,
    "phi3": gguf.MODEL_ARCH.PHI3,
}

# A SentencePiece vocabulary: control tokens, the 256 byte-fallback tokens, then pieces
# (scored so that longer pieces win).
SPM_PIECES = ["▁"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [
    "▁t", "he", "▁the", "▁a", "in", "▁in", "er", "on", "▁w", "or", "▁wor", "ld", "▁world",
    "lo", "llo", "▁he", "▁hello", "▁s", "ea", "▁sea",
]
SPM_TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES
SPM_VOCAB = len(SPM_TOKENS)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for interleaved RoPE: each head's (2, half) rows as (half, 2)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of `_permute`: llama.cpp's q/k rows back in Hugging Face's order."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# mlx-lm's stacked experts (`...switch_mlp.gate_proj`), which the package's name map does
# not know, as the tensors llama.cpp's converter stacks them into.
STACKED_EXPERTS = {
    "gate_proj": gguf.MODEL_TENSOR.FFN_GATE_EXP,
    "up_proj": gguf.MODEL_TENSOR.FFN_UP_EXP,
    "down_proj": gguf.MODEL_TENSOR.FFN_DOWN_EXP,
}


def _gguf_name(names, hf: str) -> str:
    """The GGUF name of checkpoint tensor `hf`."""
    parts = hf.split(".")
    if "switch_mlp" in parts:
        layer, projection = int(parts[2]), parts[parts.index("switch_mlp") + 1]
        return gguf.TENSOR_NAMES[STACKED_EXPERTS[projection]].format(bid=layer) + "." + parts[-1]
    mapped = names.get_name(hf, try_suffixes=(".weight", ".bias"))
    assert mapped, f"no GGUF name for {hf}"
    return mapped


def _vocabulary(writer: gguf.GGUFWriter, kind: str, vocab_size: int) -> None:
    if kind == "gpt2":
        from checkpoints import byte_tokenizer

        vocab = byte_tokenizer().get_vocab()
        tokens = sorted(vocab, key=vocab.get)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
        writer.add_token_merges([])
        return
    assert vocab_size == SPM_VOCAB, "SentencePiece checkpoints need vocab_size=SPM_VOCAB"
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(SPM_PIECES)
    scores = [0.0] * (3 + 256) + [-100.0 + 10.0 * len(p) + 0.01 * i for i, p in enumerate(SPM_PIECES)]
    writer.add_tokenizer_model(kind)
    writer.add_token_list(SPM_TOKENS)
    writer.add_token_types(types)
    writer.add_token_scores(scores)
    writer.add_add_space_prefix(kind == "llama")
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)


def write_gguf(checkpoint: Path, out: Path, tokenizer: str = "gpt2", raw=None, extra=None, file_type=None) -> Path:
    """The checkpoint's f32 weights as a GGUF file at `out`, with a `tokenizer` vocabulary
    (`gpt2`, or SentencePiece `llama` / `gemma`). `raw` maps checkpoint names to
    `(blocks, qtype)` stored instead of their weights, `extra` GGUF names to more such
    tensors; `file_type` is written as `general.file_type`."""
    config = json.loads((checkpoint / "config.json").read_text())
    arch = GGUF_ARCH[config["model_type"]]
    name = gguf.MODEL_ARCH_NAMES[arch]
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim", config["hidden_size"] // heads)
    writer = gguf.GGUFWriter(str(out), name)
    if file_type is not None:
        writer.add_file_type(file_type)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if "sliding_window" in config:
        writer.add_sliding_window(config["sliding_window"])
    if "attn_logit_softcapping" in config:
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    if arch == gguf.MODEL_ARCH.PHI3:
        writer.add_rope_dimension_count(int(head_dim * config.get("partial_rotary_factor", 1.0)))
        if "rope_scaling" in config:
            writer.add_rope_scaling_orig_ctx_len(config["original_max_position_embeddings"])
            factors = np.array(config["rope_scaling"]["long_factor"], dtype=np.float32)
            writer.add_tensor("rope_factors_long.weight", factors)
            writer.add_tensor("rope_factors_short.weight", np.ones_like(factors))
    experts = config.get("num_experts", config.get("num_local_experts"))
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
    if "moe_intermediate_size" in config:
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    _vocabulary(writer, tokenizer, config["vocab_size"])

    names = gguf.get_tensor_name_map(arch, layers)
    for hf, value in mx.load(str(checkpoint / "model.safetensors")).items():
        w = np.array(value.astype(mx.float32))
        if arch == gguf.MODEL_ARCH.LLAMA and hf.endswith(("q_proj.weight", "k_proj.weight")):
            w = _permute(w, heads if "q_proj" in hf else kv_heads)
        if arch in (gguf.MODEL_ARCH.GEMMA2, gguf.MODEL_ARCH.GEMMA3) and hf.endswith("norm.weight"):
            w = w + 1.0
        mapped = _gguf_name(names, hf)
        if hf in (raw or {}):
            blocks, qtype = raw[hf]
            writer.add_tensor(mapped, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(mapped, w)
    for name, (blocks, qtype) in (extra or {}).items():
        writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
