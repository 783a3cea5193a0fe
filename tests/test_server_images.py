"""Images through the server on random-weight vision checkpoints (written with mlx-vlm's classes,
tests/vision_checkpoints.py): Gemma 3 (a fixed token count an image) and Qwen2.5-VL (tokens by
the picture's size, placed on its grid by multimodal RoPE). Sent by the real clients: the
`openai` SDK (chat and responses), the `anthropic` SDK and the `ollama` client, which all reach
the same seeded reply for the same picture and question. A seeded reply about an image is
byte-identical alone, among 1-15 other text and image rows and after a prefix-cache hit; a
different picture never reuses another's KV; bad images get a clear 400."""

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import numpy as np
import ollama
import pytest
from openai import OpenAI
from PIL import Image

from conftest import DEFAULT_MODEL, Seedbar, default_gguf, serving
from vision_checkpoints import TOKENS_PER_IMAGE, qwen_grid, write_qwen_vision_checkpoint, write_vision_checkpoint

SEER = "seer"
QWEN = "qwen-seer"
QUESTION = "What is in this picture?"
# Before the picture, long enough that the prompt passes the prefix cache's block (256 tokens
# on the CPU) after the picture: a prefix hit then holds the picture, which still stands
# close to the reply.
PREAMBLE = "Look closely and describe every part of it, its colours, its light and its shapes. " * 2
# No KV files between the servers of one test: a fresh server starts cold.
NO_DISK = ("--prompt-cache-disk-gb", "0")
SAMPLING = dict(seed=11, temperature=0.9, max_tokens=24)


def picture(seed, size=(320, 240), kind="PNG"):
    """Encoded bytes of a noisy gradient picture."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x * y) % 255], axis=-1)
    pixels = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=kind)
    return out.getvalue()


def data_url(data, media_type="image/png"):
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


PICTURES = [picture(k) for k in range(4)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    sb = Seedbar(root / "home")
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    sb.run("models", "add", write_vision_checkpoint(root / "seer"), "--name", SEER)
    sb.run("models", "add", write_qwen_vision_checkpoint(root / "qwen"), "--name", QWEN)
    return sb


@pytest.fixture(scope="module")
def server(store):
    with serving(store, model=SEER) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def image_chat(client, image, question=QUESTION, before="", model=SEER, **overrides):
    content = [{"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": data_url(image)}}]
    if before:
        content = [{"type": "text", "text": before + question}, content[1]]
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], **{**SAMPLING, **overrides}
    )


def text_chat(client, text, seed, model=SEER):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], seed=seed, temperature=0.9, max_tokens=24
    )


def responses_reply(client, image_url, model=SEER):
    """The Responses API's seeded reply to QUESTION about the image at `image_url`."""
    return client.responses.create(
        model=model,
        input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": image_url}]}],
        max_output_tokens=SAMPLING["max_tokens"],
        temperature=SAMPLING["temperature"],
        extra_body={"seed": SAMPLING["seed"]},
    ).output_text


def anthropic_reply(server, source, model=SEER):
    """The `anthropic` SDK's seeded reply to QUESTION about the image `source` (a source block)."""
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0).messages.create(
        model=model,
        max_tokens=SAMPLING["max_tokens"],
        messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "image", "source": source}]}],
        extra_body={"seed": SAMPLING["seed"], "temperature": SAMPLING["temperature"]},
    ).content[0].text


def png_source(image):
    return {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}


def image_first_replies(server, client, image, model=SEER):
    """The `ollama` client's seeded reply (Ollama puts a message's images before its text) and
    the `openai` SDK's to the same image-then-question message."""
    ollama_reply = ollama.Client(host=server.url, timeout=120).chat(
        model=model,
        messages=[{"role": "user", "content": QUESTION, "images": [image]}],
        # Ollama's own defaults (top_k 40, top_p 0.9) off, as OpenAI's are.
        options={"seed": SAMPLING["seed"], "temperature": SAMPLING["temperature"], "num_predict": SAMPLING["max_tokens"], "top_k": 0, "top_p": 1.0},
    )
    openai_reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image)}}, {"type": "text", "text": QUESTION}]}],
        **SAMPLING,
    )
    return ollama_reply.message.content, openai_reply.choices[0].message.content


def test_every_client_sends_an_image_and_gets_the_same_seeded_reply(server, client):
    chat = image_chat(client, PICTURES[0])
    reply = chat.choices[0].message.content
    assert reply
    # The question's bytes, the template's, and the image: its markers and soft tokens.
    assert chat.usage.prompt_tokens > TOKENS_PER_IMAGE + len(QUESTION)

    assert responses_reply(client, data_url(PICTURES[0])) == reply
    assert anthropic_reply(server, png_source(PICTURES[0])) == reply
    ollama_reply, openai_reply = image_first_replies(server, client, PICTURES[0])
    assert ollama_reply == openai_reply


def test_the_picture_reaches_the_reply(client):
    """Different pictures, same question and seed: different replies (the image is read)."""
    replies = {image_chat(client, p).choices[0].message.content for p in PICTURES}
    assert len(replies) > 1, replies


@pytest.mark.parametrize("layout", [None, "cuda", "metal"], ids=["cpu", "cuda-layout", "metal-layout"])
def test_a_seeded_image_reply_is_identical_alone_batched_and_after_a_prefix_hit(store, layout):
    """On this machine's layout, and on the GPUs' laid out on the CPU (`SEEDBAR_TEST_LAYOUT`,
    debug builds): pooled decode rows, chunks aligned to their positions."""
    env = {"SEEDBAR_TEST_LAYOUT": layout} if layout else None
    # A server of its own, so the first request is cold (nothing cached).
    with serving(store, *NO_DISK, model=SEER, env=env) as fresh:
        client = OpenAI(base_url=fresh.base_url, api_key="unused", max_retries=0, timeout=120)
        alone = image_chat(client, PICTURES[1], before=PREAMBLE)
        assert alone.usage.prompt_tokens_details.cached_tokens == 0
        expected = alone.choices[0].message.content

        # Batched with 1-15 others: text rows and image rows, other seeds, arriving together.
        def other(k):
            if k % 2:
                return text_chat(client, f"Tell me about the number {k}.", seed=100 + k)
            return image_chat(client, PICTURES[(k // 2) % 4], question=f"Describe picture {k}.", seed=200 + k)

        for siblings in (1, 5, 15):
            with ThreadPoolExecutor(siblings + 1) as pool:
                mine = pool.submit(image_chat, client, PICTURES[1], before=PREAMBLE)
                rest = [pool.submit(other, k) for k in range(siblings)]
                [r.result() for r in rest]
                got = mine.result()
            assert got.choices[0].message.content == expected, f"among {siblings} others"

        again = image_chat(client, PICTURES[1], before=PREAMBLE)
        if layout is None:
            # The GPU layouts reuse whole 512-token blocks: this prompt is shorter.
            assert again.usage.prompt_tokens_details.cached_tokens >= 256, "the prefix cache held it"
        assert again.choices[0].message.content == expected


def test_another_picture_never_reuses_an_images_kv(store):
    """Same question, another picture: the prefix cache stops before the image (its keys are
    the picture's content), and the reply is that picture's own."""
    with serving(store, *NO_DISK, model=SEER) as fresh:
        client = OpenAI(base_url=fresh.base_url, api_key="unused", max_retries=0, timeout=120)
        cold_b = image_chat(client, PICTURES[3], before=PREAMBLE, logprobs=True)
    with serving(store, *NO_DISK, model=SEER) as fresh:
        client = OpenAI(base_url=fresh.base_url, api_key="unused", max_retries=0, timeout=120)
        a = image_chat(client, PICTURES[2], before=PREAMBLE, logprobs=True)
        a_again = image_chat(client, PICTURES[2], before=PREAMBLE)
        assert a_again.usage.prompt_tokens_details.cached_tokens >= 256, "a hit where the picture is the same"
        b = image_chat(client, PICTURES[3], before=PREAMBLE, logprobs=True)
        before_image = len(f"<start_of_turn>user\n{PREAMBLE}{QUESTION}\n\n".encode())
        assert b.usage.prompt_tokens_details.cached_tokens <= before_image
        # The numbers themselves: the picture moves every log-probability, if not the text.
        assert numbers(b) == numbers(cold_b)
        assert numbers(a) != numbers(b)


def numbers(reply):
    """A reply's text and its tokens' log-probabilities."""
    choice = reply.choices[0]
    return choice.message.content, [t.logprob for t in choice.logprobs.content]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


def chat_error(http, content, model=SEER):
    r = http.post("/chat/completions", json={"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4})
    return r.status_code, r.json()["error"]


def test_bad_images_get_a_clear_400(http):
    png = PICTURES[0]
    part = lambda url: [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}]
    cases = [
        (part("https://example.test/cat.png"), "not fetched from the network"),
        (part(data_url(png, "image/jpeg")), "was sent as image/jpeg"),
        (part(data_url(png, "text/plain")), "not supported"),
        (part("data:image/png;base64,@@@@"), "not valid base64"),
        (part(data_url(png[: len(png) // 2])), "could not be decoded"),
        (part(data_url(b"GIF89a" + b"\x00" * 10, "image/gif")), "could not be decoded"),
        (part(data_url(b"\x89PNG\r\n\x1a\n" + b"\x00" * (21 << 20))), "at most 20971520 bytes"),
        ([{"type": "text", "text": "hi"}] + [{"type": "image_url", "image_url": {"url": data_url(png)}}] * 17, "at most 16"),
        ([{"type": "input_audio", "input_audio": {}}], "not supported"),
    ]
    for content, expected in cases:
        status, error = chat_error(http, content)
        assert status == 400, (expected, error)
        assert expected in error["message"], (expected, error)
        assert error["type"] == "invalid_request_error"


def test_an_image_to_a_text_model_says_it_reads_text(http):
    content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": data_url(PICTURES[0])}}]
    status, error = chat_error(http, content, model=DEFAULT_MODEL)
    assert status == 400
    assert "does not take images" in error["message"], error


# ---------------------------------------------------------------------------------------------
# Qwen2.5-VL: an image's tokens follow its size.

# Sizes with 9x6, 6x9, 4x4 and 8x8 tokens under the checkpoint's budget (at most 64).
QWEN_PICTURES = [picture(10 + k, size=size) for k, size in enumerate([(400, 300), (300, 400), (112, 112), (700, 700)])]


def test_qwen_clients_send_pictures_of_any_size_and_get_the_same_seeded_reply(store):
    with serving(store, *NO_DISK, model=QWEN) as srv:
        client = OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
        sizes = {}
        for k in (0, 1, 2):
            chat = image_chat(client, QWEN_PICTURES[k], model=QWEN)
            assert chat.choices[0].message.content
            sizes[k] = chat.usage.prompt_tokens
        rows, cols = qwen_grid(400, 300)
        # The same text around 54 and 16 soft tokens.
        assert sizes[0] - sizes[2] == rows * cols - 16 and sizes[0] == sizes[1]
        reply = image_chat(client, QWEN_PICTURES[0], model=QWEN).choices[0].message.content
        assert responses_reply(client, data_url(QWEN_PICTURES[0]), model=QWEN) == reply
        assert anthropic_reply(srv, png_source(QWEN_PICTURES[0]), model=QWEN) == reply
        ollama_reply, openai_reply = image_first_replies(srv, client, QWEN_PICTURES[1], model=QWEN)
        assert ollama_reply == openai_reply
        # A sliver is refused by the processor's rule, with the protocol's error.
        status, error = chat_error(httpx.Client(base_url=srv.base_url, timeout=60), [{"type": "image_url", "image_url": {"url": data_url(picture(0, size=(2100, 10)))}}], model=QWEN)
        assert status == 400 and "times as wide" in error["message"], error


@pytest.mark.parametrize("layout", [None, "cuda"], ids=["cpu", "cuda-layout"])
def test_a_seeded_qwen_image_reply_is_identical_alone_batched_and_after_a_prefix_hit(store, layout):
    """Rows of other sizes' pictures beside it (other grids, other position shifts), text
    rows, late arrivals, and a prefix hit that holds the picture."""
    env = {"SEEDBAR_TEST_LAYOUT": layout} if layout else None
    with serving(store, *NO_DISK, model=QWEN, env=env) as fresh:
        client = OpenAI(base_url=fresh.base_url, api_key="unused", max_retries=0, timeout=120)
        mine = lambda: image_chat(client, QWEN_PICTURES[0], before=PREAMBLE, model=QWEN)
        alone = mine()
        assert alone.usage.prompt_tokens_details.cached_tokens == 0
        expected = alone.choices[0].message.content

        def other(k):
            if k % 3 == 1:
                return text_chat(client, f"Tell me about the number {k}.", seed=100 + k, model=QWEN)
            return image_chat(client, QWEN_PICTURES[1 + k % 3], question=f"Describe picture {k}.", model=QWEN, seed=200 + k)

        for siblings in (1, 7, 15):
            with ThreadPoolExecutor(siblings + 1) as pool:
                rest = [pool.submit(other, k) for k in range(siblings // 2)]
                got = pool.submit(mine)
                rest += [pool.submit(other, k) for k in range(siblings // 2, siblings)]
                [r.result() for r in rest]
            assert got.result().choices[0].message.content == expected, f"among {siblings} others"

        again = mine()
        if layout is None:
            assert again.usage.prompt_tokens_details.cached_tokens >= 256, "the prefix cache held it"
        assert again.choices[0].message.content == expected


# ---------------------------------------------------------------------------------------------
# `http(s)` image URLs, fetched where the server allows it (`--fetch-image-urls`), from a real
# HTTP server on this machine.


@pytest.fixture(scope="module")
def picture_host(tmp_path_factory):
    """A local HTTP server of a picture and a text file; its base URL."""
    import functools
    import http.server
    import threading

    root = tmp_path_factory.mktemp("pictures")
    (root / "picture.png").write_bytes(PICTURES[0])
    (root / "notes.txt").write_text("not a picture")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{host.server_address[1]}"
    host.shutdown()


def test_image_urls_are_fetched_where_the_server_allows_it(store, picture_host):
    url = f"{picture_host}/picture.png"
    with serving(store, *NO_DISK, "--fetch-image-urls", model=SEER) as srv:
        client = OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
        expected = image_chat(client, PICTURES[0]).choices[0].message.content
        content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url}}]
        chat = client.chat.completions.create(model=SEER, messages=[{"role": "user", "content": content}], **SAMPLING)
        assert chat.choices[0].message.content == expected, "the fetched picture is the same picture"
        assert responses_reply(client, url) == expected
        assert anthropic_reply(srv, {"type": "url", "url": url}) == expected
        with httpx.Client(base_url=srv.base_url, timeout=60) as http:
            for path, message in [("missing.png", "answered 404"), ("notes.txt", "is not a PNG, JPEG, WebP or GIF image")]:
                part = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": f"{picture_host}/{path}"}}]
                status, error = chat_error(http, part)
                assert status == 400 and message in error["message"], error
                assert error["param"] == "messages[0].content[1].image_url.url", error


def test_the_app_setting_turns_image_urls_on_and_off_while_serving(store, picture_host):
    """No flag at start: the settings' switch (the app's "Fetch images from web addresses")
    allows fetching from the next request on, and turning it off refuses them again."""
    url_part = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": f"{picture_host}/picture.png"}}]
    with serving(store, *NO_DISK, model=SEER) as srv, httpx.Client(base_url=srv.url, timeout=120) as app:
        http = httpx.Client(base_url=srv.base_url, timeout=120)
        status, error = chat_error(http, url_part)
        assert status == 400 and "not fetched from the network" in error["message"], error
        settings = app.get("/app/settings").json()
        assert settings["fetch_image_urls"] is False
        assert app.put("/app/settings", json={**settings, "fetch_image_urls": True}).status_code == 200
        client = OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
        expected = image_chat(client, PICTURES[0]).choices[0].message.content
        chat = client.chat.completions.create(model=SEER, messages=[{"role": "user", "content": url_part}], **SAMPLING)
        assert chat.choices[0].message.content == expected
        assert app.put("/app/settings", json={**settings, "fetch_image_urls": False}).status_code == 200
        status, error = chat_error(http, url_part)
        assert status == 400 and "not fetched from the network" in error["message"], error
