"""Seedbar in front of a remote engine (#33), with llama.cpp's llama-server as the upstream of a
remote model, in one run: the probe (engine named, seeds not promised), a seeded reply through
Seedbar equal to llama-server's own reply for that seed (whole and streamed), a request with
tools answered as llama-server answers it, a cancelled stream freeing llama-server's slot, and what the hop costs one chat (decode tok/s
through Seedbar against llama-server straight, same seed and so the same reply; best of 3).

`make bench` runs this from scripts/bench.py after the CPU comparison; `make test` runs the same
paths against a second Seedbar as the upstream (tests/test_remote_engines.py)."""

import os
import tempfile
import time
from pathlib import Path

import httpx

from cpu_peer import REPEAT, chat, free_port, repack_flags, running

PROMPT = "Write a long story about a lighthouse keeper and a storm."
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def check(ok: bool, what: str) -> None:
    print(f"  {'ok ' if ok else 'FAIL'} {what}")
    if not ok:
        raise SystemExit(f"remote engine check failed: {what}")


def slots_busy(llama: str) -> float:
    metrics = httpx.get(llama + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith("llamacpp:requests_processing"))


def compare(seedbar_bin: Path, llama_bin: Path, gguf: Path) -> None:
    cores = str(os.cpu_count() or 2)
    llama_port, seedbar_port = free_port(), free_port()
    llama_argv = [str(llama_bin), "-m", str(gguf), "--port", str(llama_port), "-np", "2", "-t", cores,
                  "-c", "4096", "--jinja", "--metrics", *repack_flags(llama_bin, gguf, cores)]
    home = tempfile.mkdtemp(prefix="seedbar-remote-bench-")
    env = dict(os.environ, SEEDBAR_HOME=home, SEEDBAR_KEY_STORE="file")
    print("Seedbar with llama-server as a remote engine (same GGUF), one run")
    with running(llama_argv, llama_port) as llama, \
            running([str(seedbar_bin), "serve", "--model", str(gguf), "--port", str(seedbar_port)],
                    seedbar_port, env=env) as ours:
        added = httpx.post(ours + "/app/remotes", json={"name": "llama", "url": llama + "/v1"}, timeout=60)
        check(added.status_code == 201, f"added: {added.text[:200]}")
        remote = added.json()
        check(remote["engine"] == "llama-server" and not remote["identical_seeds"],
              f"probed as {remote['owner']}, seeds not promised")
        upstream_model = remote["model"]
        # Settings given in full: Seedbar sends its defaults (OpenAI's: top_p 1) explicitly,
        # where llama-server's own are others (top_p 0.95).
        body = {"messages": [{"role": "user", "content": PROMPT}], "seed": 7, "temperature": 0.8,
                "top_p": 1.0, "max_tokens": 48}
        theirs = httpx.post(llama + "/v1/chat/completions", json={"model": upstream_model, **body},
                            timeout=120).json()["choices"][0]["message"]["content"]
        through = httpx.post(ours + "/v1/chat/completions", json={"model": "llama", **body}, timeout=120)
        check(through.json()["choices"][0]["message"]["content"] == theirs,
              "a seeded reply equals llama-server's own reply for that seed")
        check("llama-server at" in through.headers.get("x-seedbar-remote", "")
              and through.headers["x-seedbar-remote"].endswith("seeds not promised"),
              f"its receipt: {through.headers.get('x-seedbar-remote')}")
        streamed = chat(ours, "llama", PROMPT, 7, 48, logit_bias={})[4]
        check(streamed == theirs, "the same reply streamed")
        # Tools go through as given: the answer is llama-server's own (with SmolLM2's template,
        # which has no tool syntax, llama-server answers in text even when a call is required).
        tool_ask = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
                    "tool_choice": "required", "max_tokens": 32, "seed": 1, "temperature": 0.8, "top_p": 1.0}
        called = httpx.post(ours + "/v1/chat/completions", timeout=120, json={"model": "llama", **tool_ask})
        direct = httpx.post(llama + "/v1/chat/completions", timeout=120, json={"model": upstream_model, **tool_ask})
        message, theirs_message = called.json()["choices"][0]["message"], direct.json()["choices"][0]["message"]
        check(called.status_code == 200 and message.get("content") == theirs_message.get("content")
              and len(message.get("tool_calls") or []) == len(theirs_message.get("tool_calls") or []),
              "a request with tools gets llama-server's own answer")
        with httpx.stream("POST", ours + "/v1/chat/completions", timeout=60, json={
                "model": "llama", "stream": True, **body, "max_tokens": 2000}) as response:
            lines = response.iter_lines()
            for _ in range(5):
                next(lines)
            check(slots_busy(llama) >= 1, "llama-server runs the stream")
        deadline = time.time() + 10
        while slots_busy(llama) and time.time() < deadline:
            time.sleep(0.2)
        check(slots_busy(llama) == 0, "a client that goes away frees llama-server's slot")
        # The hop's cost: the same seeded chat (the same reply), best decode rate of REPEAT.
        def best(url, model):
            runs = [chat(url, model, PROMPT, 3, 256, logit_bias={}, top_p=1.0) for _ in range(REPEAT)]
            return max((r[3] - 1) / max(r[1] - r[0], 1e-9) for r in runs), runs[0][4]

        best(ours, "llama")
        (a, ours_text), (b, their_text) = best(ours, "llama"), best(llama, upstream_model)
        print(f"one chat through Seedbar {a:.1f} tok/s, llama-server straight {b:.1f} tok/s "
              f"({a / b:.2f}x), same reply: {ours_text == their_text}")
