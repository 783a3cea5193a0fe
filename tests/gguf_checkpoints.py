"""Random-weight GGUF files written with the `gguf` package from the safetensors checkpoints
of checkpoints.py, laid out as llama.cpp's converter lays them out (tensor names from the
package's own name map, llama's q/k rows permuted for interleaved RoPE, Gemma's norms
stored as 1 + w, experts stacked as `ffn_*_exps` with their counts in the metadata), with
a byte-level BPE or a SentencePiece vocabulary; and a vision checkpoint of
vision_checkpoints.py as llama.cpp ships one: the decoder's GGUF beside its image tower and
projector in an `mmproj` file (`write_vision_gguf`)."""

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
    "qwen2_5_vl": gguf.MODEL_ARCH.QWEN2VL,
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


def _vocabulary(writer: gguf.GGUFWriter, kind: str, vocab_size: int, markers=(), merges=()) -> None:
    if kind == "gpt2":
        from checkpoints import byte_tokenizer

        vocab = byte_tokenizer().get_vocab()
        tokens = sorted(vocab, key=vocab.get)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens + list(markers))
        writer.add_token_types([gguf.TokenType.NORMAL] * len(tokens) + [gguf.TokenType.CONTROL] * len(markers))
        writer.add_token_merges(list(merges))
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


def write_gguf(checkpoint: Path, out: Path, tokenizer: str = "gpt2", raw=None, extra=None, file_type=None, decoder=None, merges=()) -> Path:
    """The checkpoint's f32 weights as a GGUF file at `out`, with a `tokenizer` vocabulary
    (`gpt2`, or SentencePiece `llama` / `gemma`). `raw` maps checkpoint names to
    `(blocks, qtype)` stored instead of their weights, `extra` GGUF names to more such
    tensors; `file_type` is written as `general.file_type`. `decoder` is a vision
    checkpoint's `(config, weights, markers, chat template)` in place of the folder's;
    `merges` the byte vocabulary's BPE merges (none by default)."""
    if decoder is None:
        config = json.loads((checkpoint / "config.json").read_text())
        weights, markers, template = mx.load(str(checkpoint / "model.safetensors")), (), None
    else:
        config, weights, markers, template = decoder
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
    if arch == gguf.MODEL_ARCH.QWEN2VL:
        sections = config["rope_scaling"]["mrope_section"]
        writer.add_rope_dimension_sections(sections + [0] * (4 - len(sections)))
    _vocabulary(writer, tokenizer, config["vocab_size"], markers, merges)
    if template is not None:
        writer.add_chat_template(template)
        writer.add_eos_token_id(config["eos_token_id"][0])

    names = gguf.get_tensor_name_map(arch, layers)
    for hf, value in weights.items():
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


def _decoder(config: dict, weights: dict, markers, template):
    """A vision checkpoint's decoder as `write_gguf` takes it: its text config and its weights
    under a text model's names."""
    text = dict(config.get("text_config") or config)
    text.pop("vision_config", None)
    text.setdefault("eos_token_id", config["eos_token_id"])
    text.setdefault("vocab_size", config["vocab_size"])
    # A tied head is the embeddings (mlx-vlm's Gemma 3 keeps an unused `lm_head` beside them).
    tied = text.get("tie_word_embeddings", text["model_type"] == "gemma3_text")
    renamed = {}
    for name, value in weights.items():
        if name.startswith("language_model.") and not (tied and "lm_head" in name):
            renamed[name[len("language_model."):]] = value
    return text, renamed, markers, template


def write_mmproj(checkpoint: Path, weights: dict, out: Path) -> Path:
    """The image tower and projector of vision checkpoint `checkpoint` (its `weights`, loaded)
    as llama.cpp's converter writes an `mmproj` file (float32): the `clip` architecture, the
    tower's sizes and the
    processor's mean and deviation under `clip.vision.*`, tensors under the package's mmproj
    names from their Hugging Face names and layouts (Gemma's projector norm as 1 + w; Qwen's
    qkv split into q, k, v and its patch kernel into its two frames)."""
    config = json.loads((checkpoint / "config.json").read_text())
    processor = json.loads((checkpoint / "preprocessor_config.json").read_text())
    vision = config["vision_config"]
    qwen = config["model_type"] == "qwen2_5_vl"
    blocks = vision["depth"] if qwen else vision["num_hidden_layers"]
    writer = gguf.GGUFWriter(str(out), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim((config.get("text_config") or config)["hidden_size"])
    writer.add_vision_patch_size(vision["patch_size"])
    writer.add_vision_embedding_length(vision["hidden_size"])
    writer.add_vision_feed_forward_length(vision["intermediate_size"])
    writer.add_vision_block_count(blocks)
    writer.add_vision_head_count(vision["num_heads"] if qwen else vision["num_attention_heads"])
    writer.add_vision_image_mean(processor["image_mean"])
    writer.add_vision_image_std(processor["image_std"])
    if qwen:
        writer.add_clip_projector_type(gguf.VisionProjectorType.QWEN25VL)
        writer.add_vision_image_size(vision.get("image_size", 560))
        writer.add_vision_use_silu(True)
        writer.add_vision_n_wa_pattern(vision["fullatt_block_indexes"][0] + 1)
        writer.add_vision_window_size(vision["window_size"])
        writer.add_vision_min_pixels(processor["min_pixels"])
        writer.add_vision_max_pixels(processor["max_pixels"])
        writer.add_vision_attention_layernorm_eps(config.get("rms_norm_eps", 1e-6))
    else:
        writer.add_clip_projector_type(gguf.VisionProjectorType.GEMMA3)
        writer.add_vision_image_size(vision["image_size"])
        writer.add_vision_use_gelu(True)
        writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
        per_side = int(config["mm_tokens_per_image"] ** 0.5)
        scale = vision["image_size"] // vision["patch_size"] // per_side
        if scale != 4:
            writer.add_vision_projector_scale_factor(scale)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, blocks)

    def add(hf, w):
        stem, suffix = hf.rsplit(".", 1)
        mapped = names.get_name(stem)
        assert mapped, f"no mmproj name for {hf}"
        writer.add_tensor(f"{mapped}.{suffix}", np.ascontiguousarray(w))

    for name, value in weights.items():
        if not name.startswith(("vision_tower.", "multi_modal_projector.")):
            continue
        w = np.array(value.astype(mx.float32))
        if qwen:
            hf = "visual." + name[len("vision_tower."):]
            if hf.endswith("patch_embed.proj.weight"):
                # MLX's [D, t, p, p, 3] as PyTorch's [D, 3, t, p, p], one kernel a frame.
                w = w.transpose(0, 4, 1, 2, 3)
                writer.add_tensor("v.patch_embd.weight", np.ascontiguousarray(w[:, :, 0]))
                writer.add_tensor("v.patch_embd.weight.1", np.ascontiguousarray(w[:, :, 1]))
            elif ".qkv." in hf:
                for part, rows in zip("qkv", np.split(w, 3, axis=0)):
                    add(hf.replace(".qkv.", f".{part}."), rows)
            else:
                add(hf, w)
            continue
        hf = name.replace("_weight", ".weight")
        if hf.endswith("patch_embedding.weight"):
            w = w.transpose(0, 3, 1, 2)  # MLX's [D, p, p, 3] as PyTorch's [D, 3, p, p]
        if hf.endswith("soft_emb_norm.weight"):
            w = w + 1.0
        add(hf, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def write_vision_gguf(checkpoint: Path, folder: Path, merges=()) -> Path:
    """Vision checkpoint `checkpoint` as llama.cpp's files in `folder`: the decoder's
    `model.gguf` (vocabulary with the image markers and `merges`, the chat template) and
    beside it `mmproj-model-f32.gguf`. Returns the model file's path."""
    from vision_checkpoints import IMAGE_MARKERS, QWEN_MARKERS, QWEN_TEMPLATE, TEMPLATE

    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((checkpoint / "config.json").read_text())
    qwen = config["model_type"] == "qwen2_5_vl"
    markers, template = (QWEN_MARKERS, QWEN_TEMPLATE) if qwen else (IMAGE_MARKERS, TEMPLATE)
    weights = mx.load(str(checkpoint / "model.safetensors"))
    decoder = _decoder(config, weights, markers, template)
    model = write_gguf(checkpoint, folder / "model.gguf", decoder=decoder, merges=merges)
    write_mmproj(checkpoint, weights, folder / "mmproj-model-f32.gguf")
    return model


def write_deeper_gguf(source: Path, out: Path, times: int) -> Path:
    """GGUF `source` with `times` as many blocks, the added ones after its own, each a copy
    of its last block whose output products (`attn_output`, `ffn_down`) are zero: every block adds
    exactly nothing to the residual stream, so the model's logits are `source`'s bit for bit
    while a step costs as many blocks more. A target that agrees with its draft model
    (`source`) as a well-matched pair does, at a multiple of its cost (tests and benches of
    draft models, which have no larger model of the same vocabulary at hand)."""
    reader = gguf.GGUFReader(str(source))
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    blocks_key = f"{arch}.block_count"
    blocks = int(reader.fields[blocks_key].contents())
    extra_layers = blocks * (times - 1)
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = blocks + extra_layers if field.name == blocks_key else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub_type)
    last = f"blk.{blocks - 1}."
    tensors = [(t.name, t.data, t.tensor_type) for t in reader.tensors]
    for k in range(extra_layers):
        for name, data, kind in list(tensors):
            if name.startswith(last):
                silent = name.endswith(("attn_output.weight", "ffn_down.weight"))
                tensors.append((f"blk.{blocks + k}." + name[len(last):], np.zeros_like(data) if silent else data, kind))
    for name, data, kind in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(data)
    writer.close()
    return out
