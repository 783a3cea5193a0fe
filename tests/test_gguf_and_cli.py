"""The real model end to end through the CLI: answers, seeds, GGUF -> MLX conversion (loaded
by Seedbar and by mlx-lm), the store, and clear errors for bad input."""

import json
import struct

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.utils import load_model

from checkpoints import write_checkpoint
from conftest import DEFAULT_MODEL, default_gguf

QUESTION = "What is the capital of France? Answer in one sentence."
POEM = "Write a short poem about the sea."


def reply(seedbar, *args):
    return seedbar.run("run", *args).stdout


def test_default_model_answers_paris(seedbar):
    assert "Paris" in reply(seedbar, QUESTION)


def test_same_seed_same_reply_across_processes_different_seeds_differ(seedbar):
    args = ["--temp", "0.8", "--max-tokens", "48", POEM]
    first = reply(seedbar, "--seed", "1234", *args)
    second = reply(seedbar, "--seed", "1234", *args)
    other = reply(seedbar, "--seed", "4321", *args)
    assert first == second
    assert first != other
    assert len(first.split()) > 10


def test_unseeded_run_reports_the_seed_that_reproduces_it(seedbar):
    proc = seedbar.run("run", "--temp", "0.8", "--max-tokens", "24", POEM)
    seed = proc.stderr.split("[seed ")[1].split(" ")[0]
    assert reply(seedbar, "--seed", seed, "--temp", "0.8", "--max-tokens", "24", POEM) == proc.stdout


@pytest.fixture(scope="module")
def converted(seedbar, tmp_path_factory):
    out = tmp_path_factory.mktemp("converted") / "smollm2-mlx"
    seedbar.run("convert", default_gguf(), out)
    return out


def test_converted_directory_has_the_mlx_layout(converted):
    names = {p.name for p in converted.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= names
    config = json.loads((converted / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    assert config["quantization"]["group_size"] == 32 and config["quantization"]["bits"] in (4, 8)
    assert "<|im_start|>" in json.loads((converted / "tokenizer_config.json").read_text())["chat_template"]


def test_gguf_and_converted_give_the_same_greedy_text(seedbar, converted):
    """The same values, so the same text, where both read their products' input alike: a
    GGUF as llama.cpp (int8), a converted MLX folder as mlx-lm (float) unless asked."""
    for activations in ["int8", "float"]:
        args = ["--activations", activations, "--max-tokens", "64", POEM]
        gguf_text = reply(seedbar, "--model", DEFAULT_MODEL, *args)
        mlx_text = reply(seedbar, "--model", converted, *args)
        assert gguf_text == mlx_text, activations
        assert len(gguf_text.split()) > 10
    assert reply(seedbar, "--model", DEFAULT_MODEL, "--max-tokens", "64", POEM) == reply(
        seedbar, "--model", DEFAULT_MODEL, "--activations", "int8", "--max-tokens", "64", POEM)
    assert reply(seedbar, "--model", converted, "--max-tokens", "64", POEM) == reply(
        seedbar, "--model", converted, "--activations", "float", "--max-tokens", "64", POEM)


def test_mlx_lm_loads_the_converted_model_and_agrees(seedbar, converted, tmp_path):
    prompt = seedbar.probe(DEFAULT_MODEL, texts=_write(tmp_path, [f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"]))["encoded"][0]
    ours = seedbar.probe(str(converted), ids=prompt, generate=8, logits_out=str(tmp_path / "l.safetensors"))
    model, _ = load_model(converted)
    expected = np.array(model(mx.array([prompt])).astype(mx.float32))
    logits = np.array(mx.load(str(tmp_path / "l.safetensors"))["logits"])
    # mlx-lm runs 4/8-bit kernels, Seedbar the same weights expanded to f32: close, not equal.
    assert np.abs(logits - expected).max() < 0.05 * np.abs(expected).max()
    assert (logits[0].argmax(-1) == expected[0].argmax(-1)).mean() > 0.9


def _write(tmp_path, texts):
    p = tmp_path / "texts.json"
    p.write_text(json.dumps(texts))
    return str(p)


def test_models_lists_the_store(seedbar):
    out = seedbar.run("models").stdout
    assert DEFAULT_MODEL in out and "gguf" in out


def assert_clear_failure(proc, *needles):
    assert proc.returncode == 1, proc.stderr
    assert "panicked" not in proc.stderr and "RUST_BACKTRACE" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_unknown_model_is_a_clear_error(seedbar):
    assert_clear_failure(seedbar.run("run", "--model", "no-such-model", "hi", check=False), "no-such-model", "not in the store")


def test_corrupt_gguf_is_a_clear_error(seedbar, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<I", 3) + b"\x00" * 7)
    assert_clear_failure(seedbar.run("run", "--model", bad, "hi", check=False), "broken.gguf")


def test_truncated_safetensors_is_a_clear_error(seedbar, tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", "llama")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert_clear_failure(seedbar.run("run", "--model", path, "hi", check=False), "model.safetensors")


def test_unsupported_architecture_is_named(seedbar, tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", "llama")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "gpt_neox"}))
    assert_clear_failure(
        seedbar.run("run", "--model", path, "hi", check=False),
        "unsupported model architecture `gpt_neox`",
        "(supported: gemma2, gemma3_text, llama, mistral, mixtral, phi3, qwen2, qwen3, qwen3_moe, smollm3)",
    )


def test_wrong_shapes_name_the_tensor(seedbar, tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", "llama")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    assert_clear_failure(seedbar.run("run", "--model", path, "hi", check=False), "gate_proj.weight", "shape")


def test_missing_tokenizer_is_named(seedbar, tmp_path):
    path = write_checkpoint(tmp_path / "ckpt", "llama")
    (path / "tokenizer.json").unlink()
    assert_clear_failure(seedbar.run("run", "--model", path, "hi", check=False), "tokenizer.json", "not found")


def test_bad_sampling_parameters_are_refused(seedbar):
    assert_clear_failure(seedbar.run("run", "--temp=-1", "hi", check=False), "temperature")


def test_pull_without_a_reachable_hub_says_so(seedbar):
    env = seedbar.env(HF_ENDPOINT="http://127.0.0.1:9")
    proc = seedbar.run("pull", "HuggingFaceTB/SmolLM2-135M-Instruct", check=False, env=env)
    assert_clear_failure(proc, "cannot reach the Hugging Face hub")


def test_pull_rejects_a_malformed_repo_id(seedbar):
    assert_clear_failure(seedbar.run("pull", "not-a-repo", check=False), "org/name")
