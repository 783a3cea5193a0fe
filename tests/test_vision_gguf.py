"""Vision models as llama.cpp users have them: the decoder's GGUF with its image tower and
projector in an `mmproj` file beside it (tests/gguf_checkpoints.py writes both from the
random-weight vision checkpoints, laid out as llama.cpp's converter lays them out). The pair
answers as the safetensors folder of the same weights does, for Gemma 3 and Qwen2.5-VL: the
same pixels, image features and logits (float32 tolerance) and the same greedy continuation.
Through the library: `models add` takes the projector along, the model lists the `vision`
capability, its seeded reply about a picture is the folder's, alone and batched; without its
projector the same file is a text model and says so."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from openai import OpenAI

from conftest import Seedbar, serving
from gguf_checkpoints import write_vision_gguf
from test_server_images import NO_DISK, QWEN_PICTURES, chat_error, data_url, image_chat, text_chat
from test_vision_parity import photo, probe_with_images, within
from vision_checkpoints import GGUF_TEXT, chat_ids, qwen_chat_ids, write_qwen_vision_checkpoint, write_vision_checkpoint


@pytest.mark.parametrize("family", ["gemma3", "qwen2_5_vl"])
def test_a_gguf_with_its_projector_answers_as_its_folder(seedbar, tmp_path, family):
    if family == "gemma3":
        folder = write_vision_checkpoint(tmp_path / "ckpt", text=GGUF_TEXT)
        files = [photo(tmp_path / "img0.png", seed=1)]
        ids = chat_ids("What is in", "this picture?")
    else:
        folder = write_qwen_vision_checkpoint(tmp_path / "ckpt")
        sizes = [(400, 300), (300, 420)]
        files = [photo(tmp_path / f"img{k}.png", seed=k, size=size) for k, size in enumerate(sizes)]
        ids = qwen_chat_ids("Compare ", " with this.", sizes)
    model = write_vision_gguf(folder, tmp_path / "gguf")
    (tmp_path / "from-folder").mkdir()
    (tmp_path / "from-gguf").mkdir()
    expected, expected_images, expected_logits = probe_with_images(seedbar, folder, ids, files, tmp_path / "from-folder")
    got, images, logits = probe_with_images(seedbar, model, ids, files, tmp_path / "from-gguf")
    for k in range(len(files)):
        assert np.array_equal(np.array(images[f"pixels{k}"]), np.array(expected_images[f"pixels{k}"])), f"image {k} pixels"
        within(np.array(images[f"features{k}"]), np.array(expected_images[f"features{k}"]), f"image {k} features")
    within(logits, expected_logits, "logits")
    assert got["generated"] == expected["generated"]


def test_a_gguf_vision_model_through_the_library_and_the_server(tmp_path):
    home = Seedbar(tmp_path / "home")
    folder = write_qwen_vision_checkpoint(tmp_path / "qwen")
    home.run("models", "add", folder, "--name", "qwen-folder")
    home.run("models", "add", write_vision_gguf(folder, tmp_path / "downloads"), "--name", "qwen-gguf")
    projector = home.home / "models" / "qwen-gguf" / "mmproj-model-f32.gguf"
    assert projector.is_file(), "the projector came along"
    with serving(home, *NO_DISK, model="qwen-gguf") as srv:
        client = OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
        listed = {m["name"]: m["capabilities"] for m in httpx.get(f"{srv.url}/app/models", timeout=60).json()}
        assert "vision" in listed["qwen-gguf"] and "vision" in listed["qwen-folder"], listed
        mine = lambda: image_chat(client, QWEN_PICTURES[0], model="qwen-gguf").choices[0].message.content
        alone = mine()

        def other(k):
            if k % 2:
                return text_chat(client, f"Tell me about the number {k}.", seed=100 + k, model="qwen-gguf")
            return image_chat(client, QWEN_PICTURES[1 + k % 3], question=f"Describe picture {k}.", model="qwen-gguf", seed=200 + k)

        with ThreadPoolExecutor(8) as pool:
            rest = [pool.submit(other, k) for k in range(3)]
            got = pool.submit(mine)
            rest += [pool.submit(other, k) for k in range(3, 7)]
            [r.result() for r in rest]
        assert got.result() == alone, "batched with 7 others"
        assert image_chat(client, QWEN_PICTURES[0], model="qwen-folder").choices[0].message.content == alone
    # The same model file without its projector reads text only, and says so.
    projector.unlink()
    with serving(home, *NO_DISK, model="qwen-gguf") as srv:
        content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": data_url(QWEN_PICTURES[0])}}]
        status, error = chat_error(httpx.Client(base_url=srv.base_url, timeout=60), content, model="qwen-gguf")
        assert status == 400 and "does not take images" in error["message"], error
