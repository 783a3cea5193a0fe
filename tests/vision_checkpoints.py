"""Small random-weight vision-language checkpoints written with mlx-vlm's own model classes
(Gemma 3: a SigLIP tower, the multimodal projector and the Gemma 3 decoder), so Seedbar's
image path can be checked against mlx-vlm on identical weights. The vocabulary is the 256
bytes and Gemma 3's image markers; the chat template writes `<start_of_image>` for each
image part, as Gemma 3's does."""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path

from checkpoints import byte_tokenizer

BYTES = 256
START, END, SOFT = BYTES, BYTES + 1, BYTES + 2
IMAGE_MARKERS = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
VOCAB = BYTES + len(IMAGE_MARKERS)
TOKENS_PER_IMAGE = 16

TEXT = dict(
    model_type="gemma3_text",
    hidden_size=96,
    num_hidden_layers=3,
    intermediate_size=160,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    query_pre_attn_scalar=48,
    rms_norm_eps=1e-6,
    vocab_size=VOCAB,
    rope_theta=1_000_000.0,
    rope_global_base_freq=1_000_000.0,
    rope_local_base_freq=10_000.0,
    # Window 8 on layers 0 and 2: the image's 16 tokens are longer than the window.
    sliding_window=8,
    sliding_window_pattern=2,
    mm_tokens_per_image=TOKENS_PER_IMAGE,
    max_position_embeddings=2048,
)
# 224 / 14 = 16 patches a side, pooled 4x4 into 16 tokens.
VISION = dict(
    model_type="siglip_vision_model",
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    patch_size=14,
    image_size=224,
    layer_norm_eps=1e-6,
)
CONFIG = dict(
    model_type="gemma3",
    text_config=TEXT,
    vision_config=VISION,
    hidden_size=TEXT["hidden_size"],
    vocab_size=VOCAB,
    image_token_index=SOFT,
    boi_token_index=START,
    eoi_token_index=END,
    mm_tokens_per_image=TOKENS_PER_IMAGE,
    pad_token_id=0,
    eos_token_id=[BYTES - 1],
)
PREPROCESSOR = dict(
    image_processor_type="Gemma3ImageProcessor",
    do_convert_rgb=True,
    do_normalize=True,
    do_rescale=True,
    do_resize=True,
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
    resample=2,
    rescale_factor=1 / 255,
    size={"height": VISION["image_size"], "width": VISION["image_size"]},
)
# Gemma 3's way with content parts: an image part is its marker, text parts their text.
TEMPLATE = """{%- for message in messages -%}
<start_of_turn>{{ message['role'] }}
{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}<start_of_image>{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% endfor %}{% endif %}<end_of_turn>
{% endfor -%}
{%- if add_generation_prompt %}<start_of_turn>model
{% endif -%}"""


def expanded_image(tokens: int = TOKENS_PER_IMAGE) -> list:
    """The tokens an image becomes in the prompt: blank lines around its marked soft tokens."""
    newline = list(b"\n\n")
    return newline + [START] + [SOFT] * tokens + [END] + newline


def chat_ids(text_before: str, text_after: str, images: int = 1) -> list:
    """A user turn's prompt ids: `text_before`, then `images` images, then `text_after`,
    rendered as TEMPLATE renders `[text, image..., text]` parts."""
    ids = list(f"<start_of_turn>user\n{text_before.strip()}".encode())
    for _ in range(images):
        ids += expanded_image()
    ids += list(f"{text_after.strip()}<end_of_turn>\n<start_of_turn>model\n".encode())
    return ids


# What llama.cpp's GGUF reader assumes of a Gemma 3 decoder (it has no keys for these): a
# query scale of 1/sqrt(head_dim) and every sixth layer global.
GGUF_TEXT = dict(TEXT, num_hidden_layers=6, query_pre_attn_scalar=TEXT["head_dim"], sliding_window_pattern=6)


def write_vision_checkpoint(directory: Path, seed: int = 0, text=None) -> Path:
    """A random-weight Gemma 3 vision checkpoint in `directory`, loadable by mlx-vlm and
    Seedbar; `text` replaces the decoder's settings (TEXT)."""
    from mlx_vlm.models import gemma3

    text = text or TEXT
    config = gemma3.ModelConfig(
        text_config=gemma3.TextConfig(**{k: v for k, v in text.items() if k != "rope_theta"}),
        vision_config=gemma3.VisionConfig(**VISION),
        **{k: v for k, v in CONFIG.items() if k not in ("text_config", "vision_config", "boi_token_index", "eoi_token_index", "mm_tokens_per_image")},
    )
    mx.random.seed(seed)
    model = gemma3.Model(config)
    # Small norm weights, as the text checkpoints do for Gemma, whose norms scale by 1 + w; the
    # tower's LayerNorms scale by their weight.
    widen(model, unit_norm=lambda path: "vision_tower" in path and "norm" in path and path.endswith("weight"))
    return save(directory, model, dict(CONFIG, text_config=text), PREPROCESSOR, IMAGE_MARKERS, TEMPLATE, bos_token="<s>")


def widen(model, unit_norm) -> None:
    """Wider weights than the default init so logits are well separated (greedy continuations
    do not hinge on ties): matrices times 3, vectors small noise (around 1 where `unit_norm`
    says the path is a norm that scales by its weight), embeddings at their initial size."""

    def widened(path, p):
        if p.ndim >= 2:
            return p * 3.0
        noise = mx.random.normal(p.shape) * 0.1
        return 1.0 + noise if unit_norm(path) else noise

    model.update(tree_map_with_path(widened, model.parameters()))
    embed = model.language_model.model.embed_tokens
    embed.weight = embed.weight / 3.0


def save(directory: Path, model, config, preprocessor, markers, template, bos_token) -> Path:
    """`model`'s weights and the folder's files (config, processor, byte tokenizer with
    `markers`, chat template) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(directory / "model.safetensors"), weights, metadata={"format": "mlx"})
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens(markers)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template, "bos_token": bos_token, "eos_token": "</s>"})
    )
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [BYTES - 1]}))
    return directory


# ---------------------------------------------------------------------------------------------
# Qwen2.5-VL: its own ViT (2-D RoPE, window attention, the 2x2 merger) and a Qwen2 decoder with
# multimodal RoPE. An image's token count follows its size (one per 28x28 pixels within the
# processor's budget), so the tests' helpers take the grid.

QWEN_START, QWEN_END, QWEN_PAD = BYTES, BYTES + 1, BYTES + 2
QWEN_MARKERS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
QWEN_VOCAB = BYTES + len(QWEN_MARKERS)
# head_dim 32: 16 rotated pairs, by time, row and column.
QWEN_TEXT = dict(
    model_type="qwen2_5_vl",
    hidden_size=128,
    num_hidden_layers=2,
    intermediate_size=192,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    vocab_size=QWEN_VOCAB,
    rope_theta=1_000_000.0,
    rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]},
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
# Windows of 56 pixels = 2x2 merged tokens, full attention in blocks 1 and 3.
QWEN_VISION = dict(
    model_type="qwen2_5_vl",
    depth=4,
    hidden_size=64,
    intermediate_size=96,
    num_heads=4,
    out_hidden_size=QWEN_TEXT["hidden_size"],
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    window_size=56,
    fullatt_block_indexes=[1, 3],
    in_channels=3,
)
QWEN_CONFIG = dict(
    **QWEN_TEXT,
    vision_config=QWEN_VISION,
    image_token_id=QWEN_PAD,
    video_token_id=QWEN_VOCAB + 10,
    vision_start_token_id=QWEN_START,
    vision_end_token_id=QWEN_END,
    eos_token_id=[BYTES - 1],
)
# At most 64 tokens an image: a 400x300 picture becomes 252x168 pixels, 9x6 tokens.
QWEN_PREPROCESSOR = dict(
    image_processor_type="Qwen2VLImageProcessor",
    min_pixels=56 * 56,
    max_pixels=28 * 28 * 64,
    patch_size=14,
    temporal_patch_size=2,
    merge_size=2,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
)
QWEN_TEMPLATE = """{%- for message in messages -%}
<|im_start|>{{ message['role'] }}
{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"""


def qwen_grid(width: int, height: int) -> tuple:
    """The (rows, columns) of tokens the processor's budget gives a picture."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    h, w = smart_resize(height, width, factor=28, min_pixels=QWEN_PREPROCESSOR["min_pixels"], max_pixels=QWEN_PREPROCESSOR["max_pixels"])
    return h // 28, w // 28


def qwen_chat_ids(text_before: str, text_after: str, sizes: list) -> list:
    """A user turn's prompt ids with an image of each (width, height) in `sizes` between the
    texts, as QWEN_TEMPLATE renders it and the processor expands it."""
    ids = list(f"<|im_start|>user\n{text_before}".encode())
    for width, height in sizes:
        rows, cols = qwen_grid(width, height)
        ids += [QWEN_START] + [QWEN_PAD] * (rows * cols) + [QWEN_END]
    ids += list(f"{text_after}<|im_end|>\n<|im_start|>assistant\n".encode())
    return ids


def write_qwen_vision_checkpoint(directory: Path, seed: int = 0, quantize_bits=None) -> Path:
    """A random-weight Qwen2.5-VL checkpoint in `directory`, loadable by mlx-vlm and Seedbar;
    with `quantize_bits`, its decoder's layers quantized (groups of 32), the tower not."""
    from mlx_vlm.models import qwen2_5_vl

    text = qwen2_5_vl.TextConfig.from_dict(QWEN_TEXT)
    vision = qwen2_5_vl.VisionConfig.from_dict(QWEN_VISION)
    fields = {k: v for k, v in QWEN_CONFIG.items() if k not in QWEN_TEXT and k != "vision_config"}
    config = qwen2_5_vl.ModelConfig(text_config=text, vision_config=vision, model_type="qwen2_5_vl", vocab_size=QWEN_VOCAB, **fields)
    mx.random.seed(seed)
    model = qwen2_5_vl.Model(config)
    # Every norm scales by its weight.
    widen(model, unit_norm=lambda path: "norm" in path or "ln_q" in path)
    config = dict(QWEN_CONFIG)
    if quantize_bits:
        nn.quantize(model.language_model, group_size=32, bits=quantize_bits)
        config["quantization"] = {"group_size": 32, "bits": quantize_bits}
    return save(directory, model, config, QWEN_PREPROCESSOR, QWEN_MARKERS, QWEN_TEMPLATE, bos_token=None)
