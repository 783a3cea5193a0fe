"""The prompt cache's disk tier (#30): a long prompt's KV, written to the data directory's
`kv-cache` folder, is found again after the RAM tier let it go and after the server restarts
(a disk hit in `/metrics`, its prefill skipped: time to first token under a third of the cold
one on a 2,000-token prompt), and the seeded reply from it is the cold server's, byte for byte.
A cache file altered or cut short is found out, removed and not used (the reply is still the
cold one)."""

import json
import time

import httpx

from conftest import DEFAULT_MODEL, Seedbar, default_gguf, serving, wait_for

# Room for the 2,000-token prompt's KV, not for it and the filler's too.
RAM_MB = "120"


def rules(count, topic):
    """An agent's rules: `count` numbered lines about `topic` (about 21 tokens each)."""
    return "\n".join(
        f"Rule {i} for {topic}: always check item {i * 7 % 97} before step {i * 13 % 89}." for i in range(count)
    )


LONG = rules(100, "the build")
FILLER = rules(50, "the garden")
MEDIUM = rules(20, "the kitchen")


def store(tmp_path_factory, name):
    sb = Seedbar(tmp_path_factory.mktemp(name) / "home")
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    return sb


def ask(server, rules_text, seed=7):
    """A seeded streamed chat: (reply, seconds to its first token, usage)."""
    body = {
        "model": DEFAULT_MODEL,
        "messages": [
            {"role": "system", "content": rules_text},
            {"role": "user", "content": "Which rule matters most, and why?"},
        ],
        "max_tokens": 24,
        "temperature": 0.8,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.monotonic()
    first, reply, usage = None, "", None
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            for choice in chunk.get("choices", []):
                text = choice["delta"].get("content") or ""
                if text and first is None:
                    first = time.monotonic() - started
                reply += text
            usage = chunk.get("usage") or usage
    assert reply and first is not None
    return reply, first, usage


def disk(server, name):
    return server.metrics().get(f"seedbar_prompt_cache_disk_{name}", 0)


def cached(usage):
    return usage["prompt_tokens_details"]["cached_tokens"]


def wait_for_writes(server, n):
    wait_for(lambda: disk(server, "writes_total") >= n, timeout=60, message=f"{n} disk cache writes")


def test_a_long_prompt_comes_back_from_disk_after_ram_eviction_and_a_restart(tmp_path_factory):
    sb = store(tmp_path_factory, "disk-cache")
    with serving(sb, "--prompt-cache-ram-mb", RAM_MB) as server:
        ask(server, "Say hi.")  # first-request costs out of the cold figure
        writes = disk(server, "writes_total")
        cold, cold_ttft, usage = ask(server, LONG)
        assert 1900 <= usage["prompt_tokens"] <= 2600, usage
        assert cached(usage) < 16  # the chat template's start, from the first request
        wait_for_writes(server, writes + 1)
        # Another long prompt: the RAM tier lets the first one go.
        ask(server, FILLER)
        wait_for_writes(server, writes + 2)
        hits = disk(server, "hits_total")
        again, _, usage = ask(server, LONG)
        assert disk(server, "hits_total") == hits + 1, "not served from disk after the RAM tier let it go"
        assert cached(usage) >= usage["prompt_tokens"] - 128
        assert again == cold
    files = list((sb.home / "kv-cache").glob("*.kv"))
    assert files and all(f.stat().st_size > 0 for f in files)

    with serving(sb, "--prompt-cache-ram-mb", RAM_MB) as server:
        assert disk(server, "bytes") > 0
        ask(server, "Say hi.")
        hits = disk(server, "hits_total")
        warm, warm_ttft, usage = ask(server, LONG)
        assert disk(server, "hits_total") == hits + 1, "not served from disk after a restart"
        assert disk(server, "rejected_total") == 0
        assert cached(usage) >= usage["prompt_tokens"] - 128
        assert warm == cold, "a disk hit changed the seeded reply"
        print(f"time to first token, {usage['prompt_tokens']} tokens: cold {cold_ttft:.2f}s, from disk {warm_ttft:.2f}s")
        assert warm_ttft < cold_ttft / 3, f"time to first token {warm_ttft:.2f}s from disk, {cold_ttft:.2f}s cold"


def test_an_altered_or_torn_cache_file_is_found_out_and_not_used(tmp_path_factory):
    sb = store(tmp_path_factory, "disk-cache-corrupt")
    folder = sb.home / "kv-cache"
    with serving(sb) as server:
        cold, _, usage = ask(server, MEDIUM)
        wait_for_writes(server, 1)
    assert usage["prompt_tokens"] > 300

    def spoil(how):
        (file,) = folder.glob("*.kv")
        data = bytearray(file.read_bytes())
        if how == "altered":
            data[len(data) // 2] ^= 0x20
        else:
            data = data[: len(data) - 1000]
        file.write_bytes(bytes(data))
        return file

    for how in ["altered", "torn"]:
        spoil(how)
        with serving(sb) as server:
            reply, _, usage = ask(server, MEDIUM)
            assert disk(server, "rejected_total") == 1, f"an {how} file was not found out"
            assert disk(server, "hits_total") == 0
            assert cached(usage) == 0
            assert reply == cold
            wait_for_writes(server, 1)  # written again, whole
    # Positive control: the file written again is used.
    with serving(sb) as server:
        reply, _, usage = ask(server, MEDIUM)
        assert (disk(server, "hits_total"), disk(server, "rejected_total")) == (1, 0)
        assert cached(usage) > 0 and reply == cold


def test_a_zero_budget_keeps_nothing_on_disk(tmp_path_factory):
    sb = store(tmp_path_factory, "disk-cache-off")
    folder = sb.home / "kv-cache"
    # The setting, changed while running: what is kept goes at once.
    with serving(sb) as server:
        ask(server, MEDIUM)
        wait_for_writes(server, 1)
        assert list(folder.glob("*.kv"))
        settings = httpx.get(f"{server.url}/app/settings", timeout=30).json()
        assert settings["prompt_cache_disk_gb"] == 8
        saved = httpx.put(f"{server.url}/app/settings", json={**settings, "prompt_cache_disk_gb": 0}, timeout=30)
        assert saved.status_code == 200 and saved.json()["prompt_cache_disk_gb"] == 0
        assert disk(server, "bytes") == 0
        assert not list(folder.glob("*.kv"))
        ask(server, MEDIUM, seed=8)
        server.wait_idle()
        assert disk(server, "writes_total") == 1
    # The flag, over a saved budget.
    with serving(sb, "--prompt-cache-disk-gb", "0") as server:
        settings = httpx.get(f"{server.url}/app/settings", timeout=30).json()
        httpx.put(f"{server.url}/app/settings", json={**settings, "prompt_cache_disk_gb": 8}, timeout=30)
    with serving(sb, "--prompt-cache-disk-gb", "0") as server:
        ask(server, MEDIUM)
        server.wait_idle()
        assert disk(server, "writes_total") == 0
    assert not list(folder.glob("*.kv"))
