"""Seedbar vs llama.cpp's own llama-server on the same GGUF, over the same OpenAI HTTP API, in
one run: aggregate throughput of 1, 8 and 16 concurrent seeded chats (llama-server with as many
parallel slots, continuous batching), time to first token, batch-1 decode and the prefill of a
512-token, a 4,096-token and a 16,384-token prompt (an agent's long system prompt). Both servers stay up side by side and each scenario runs on one, then the
other, so drift on a shared machine hits both. Prints Seedbar / llama-server ratios.

`speculative` puts speculative decoding side by side for one chat: Seedbar with prompt lookup
and without it (the request's `speculative: false`), llama-server plain and with its own n-gram
speculation (`--spec-type ngram-simple`, and `ngram-mod`), on an editor's request (a file sent
back with a small change; scripts/bench-editor.txt) and a plain chat.

`draft_model` does the same for draft models: Seedbar with prompt lookup alone and with the
GGUF itself drafting (`--draft-model`) for a target of 6 times its blocks (the ones added
silent, so the same logits at 6 times the cost: a matched pair without a larger model of the
family at hand), llama-server plain and with the same draft (`-md`).

`make bench` builds llama-server (scripts/setup.sh --bench) and runs this from scripts/bench.py,
on the default Q4_1 GGUF and on a Q4_K_M file of the same weights (`q4_k_m`)."""

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

CHATS, TOKENS, REPEAT = [1, 8, 16], 128, 3
# Prompt sizes whose prefill is timed (a developer's question; agents' system prompts and tool
# lists), and how many fresh prompts of each (the 16k one, a few minutes a server, once).
PREFILLS = [(512, REPEAT), (4096, REPEAT), (16384, 1)]
# The context both servers are started with: the longest prompt and its reply fit (SmolLM2 was
# trained on 8,192 positions: Seedbar is told it may run past that, llama-server only warns).
CONTEXT = 16384 + 512
# SmolLM2's end-of-reply ids (<|endoftext|>, <|im_end|>): banned, so every chat writes TOKENS.
NO_EOS = {"0": -100, "2": -100}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(argv, port, env=None, ready="/health"):
    """A server process, once its `ready` route answers 200; stopped on exit."""
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"{argv[0]} exited: {log.read().decode(errors='replace')[-2000:]}")
            try:
                if httpx.get(url + ready, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"{argv[0]} did not become ready")
            time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def chat(url, model, prompt, seed, max_tokens, **fields):
    """One streamed seeded chat (temperature 0.8, end-of-reply banned, unless `fields` say
    otherwise; no seed sent where `seed` is None): (seconds to first token, seconds to end,
    prompt and reply tokens, reply text)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "seed": seed,
            "temperature": 0.8, "max_tokens": max_tokens, "logit_bias": NO_EOS, "stream": True,
            "stream_options": {"include_usage": True}, **fields}
    if seed is None:
        del body["seed"]
    start, first, usage, chunks, text = time.perf_counter(), None, None, 0, ""
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = httpx.Response(200, content=line[6:]).json()
            if chunk.get("usage"):
                usage = chunk["usage"]
            content = "".join(c.get("delta", {}).get("content") or "" for c in chunk.get("choices", []))
            if content:
                chunks += 1
                text += content
                first = first or time.perf_counter() - start
    end = time.perf_counter() - start
    prompt_tokens = usage["prompt_tokens"] if usage else 0
    completion = usage["completion_tokens"] if usage else chunks
    return first or end, end, prompt_tokens, completion, text


def concurrent(url, model, prompts, n, seeded=True, tokens=TOKENS):
    """n chats at once (seeded, or not): aggregate tok/s and the median time to first token."""
    results = [None] * n

    def run(i):
        results[i] = chat(url, model, prompts[i % len(prompts)], 1000 + i if seeded else None, tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    silent = sum(1 for r in results if not r[4])
    if silent:
        raise RuntimeError(f"{silent} of {n} replies from {url} streamed no text: does the model's "
                           "tokenizer decode the tokens it draws (a stub tokenizer with a random-weight "
                           "model does not)?")
    return {"tok_s": sum(r[3] for r in results) / wall, "ttft_s": statistics.median(r[0] for r in results),
            "decode_tok_s": statistics.median((r[3] - 1) / max(r[1] - r[0], 1e-9) for r in results)}


def prefill(url, model, filler, repeat):
    """(prompt tokens, best tokens per second) of a prompt of `filler`, fresh each of `repeat`
    runs (no prompt cache can serve it, Seedbar's disk cache from an earlier bench included)."""
    fresh = os.urandom(4).hex()
    runs = [chat(url, model, f"Run {run} of {fresh}: {filler}", run, 1) for run in range(repeat)]
    return runs[0][2], max(r[2] / r[0] for r in runs)


def past_trained_context(gguf: Path) -> list:
    """llama-server's flags for a context of CONTEXT on a model trained on less: it caps the
    context at the trained length, so the file's length is overridden (plain RoPE models: the
    positions past it are computed as Seedbar computes them, extrapolated)."""
    import gguf as reader

    fields = reader.GGUFReader(gguf).fields
    arch = bytes(fields["general.architecture"].parts[-1]).decode()
    return ["--override-kv", f"{arch}.context_length=int:{2 * CONTEXT}"]


def q4_k_m(llama_bin: Path, gguf: Path, out_dir: Path) -> Path:
    """A Q4_K_M file of `gguf`'s weights, written once by llama.cpp's own quantizer (beside
    llama-server). The default GGUF is the only copy of the weights the bench has, so its
    values are requantized (`--allow-requantize`): the same model in K-quant blocks (and the
    Q5_0/Q8_0 fallbacks llama.cpp picks for rows not a multiple of 256 long)."""
    out = out_dir / gguf.name.replace(".Q4_1.", ".Q4_K_M.")
    if not out.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        subprocess.run([str(llama_bin.parent / "llama-quantize"), "--allow-requantize", str(gguf),
                        str(partial), "Q4_K_M"], check=True, capture_output=True)
        partial.rename(out)
    return out


def repack_flags(llama_bin: Path, gguf: Path, cores: str) -> list:
    """llama-server's flags for this machine: none, or `--no-repack` where it crashes at start.
    llama.cpp's AMX kernels crash at the warm-up where the CPU reports AMX but the machine (a
    VM) does not enable it; --no-repack leaves them (and weight repacking) out."""
    try:
        port = free_port()
        with running([str(llama_bin), "-m", str(gguf), "--port", str(port), "-t", cores], port):
            return []
    except RuntimeError:
        print("llama-server crashed at start: running it with --no-repack (no AMX, no repacked weights)")
        return ["--no-repack"]


def compare(seedbar_bin: Path, llama_bin: Path, gguf: Path, prompts: list) -> None:
    cores = str(os.cpu_count() or 2)
    sentence = "The quick brown fox jumps over the lazy dog. "
    fillers = [(sentence * (tokens // 10), repeat) for tokens, repeat in PREFILLS]
    print(f"Seedbar vs llama-server (-np N -t {cores}), same GGUF ({gguf.name}), {TOKENS} tokens per chat, temperature 0.8, seeded")
    print(f"{'chats':<7}{'seedbar tok/s':>14}{'llama tok/s':>13}{'ratio':>8}{'seedbar ttft':>14}{'llama ttft':>12}")
    def peer_argv(n, port, extra):
        return [str(llama_bin), "-m", str(gguf), "--port", str(port), "-np", str(n), "-t", cores,
                "-c", str(CONTEXT if n == 1 else 1024 * n), *extra]

    extra = repack_flags(llama_bin, gguf, cores) + past_trained_context(gguf)
    seedbar_port = free_port()
    with running([str(seedbar_bin), "serve", "--model", str(gguf), "--port", str(seedbar_port),
                  "--max-context", str(CONTEXT), "--past-trained-context"], seedbar_port) as ours:
        model = httpx.get(ours + "/v1/models").json()["data"][0]["id"]
        single = {}
        for n in CHATS:
            port = free_port()
            with running(peer_argv(n, port, extra), port) as peer:
                concurrent(ours, model, prompts, n)  # warm-up: shapes, caches
                concurrent(peer, model, prompts, n)
                a, b = concurrent(ours, model, prompts, n), concurrent(peer, model, prompts, n)
                print(f"{n:<7}{a['tok_s']:>14.1f}{b['tok_s']:>13.1f}{a['tok_s'] / b['tok_s']:>7.2f}x"
                      f"{a['ttft_s']:>13.2f}s{b['ttft_s']:>11.2f}s")
                if n == 1:
                    single = {"ours": a, "peer": b,
                              "ours_prefill": [prefill(ours, model, *f) for f in fillers],
                              "peer_prefill": [prefill(peer, model, *f) for f in fillers]}
    a, b = single["ours"]["decode_tok_s"], single["peer"]["decode_tok_s"]
    print(f"batch-1 decode: seedbar {a:.1f} tok/s, llama-server {b:.1f} tok/s ({a / b:.2f}x)")
    for (tokens, a), (_, b) in zip(single["ours_prefill"], single["peer_prefill"]):
        print(f"prefill of {tokens} tokens: seedbar {a:.0f} tok/s, llama-server {b:.0f} tok/s ({a / b:.2f}x)")


EDITOR_PROMPT = (Path(__file__).parent / "bench-editor.txt").read_text()
# (name, prompt, fields): greedy and sampled editor requests (end-of-reply allowed: the reply
# is the file), and a plain chat.
SPECULATIVE_WORKLOADS = [
    ("editor, greedy", EDITOR_PROMPT, {"temperature": 0.0, "logit_bias": {}}),
    ("editor, t0.7", EDITOR_PROMPT, {"temperature": 0.7, "logit_bias": {}}),
    ("chat, t0.8", None, {}),
]
SPECULATIVE_TOKENS = 512


def best_decode(url, model, prompt, max_tokens, fields):
    """The best of REPEAT one-chat decode rates (reply tokens after the first over the time
    after it), with the first run's reply tokens and text."""
    runs = [chat(url, model, prompt, 2, max_tokens, **fields) for _ in range(REPEAT)]
    rate = max((r[3] - 1) / max(r[1] - r[0], 1e-9) for r in runs)
    return rate, runs[0][3], runs[0][4]


def speculative(seedbar_bin: Path, llama_bin: Path, gguf: Path, prompts: list) -> None:
    """One chat per workload, best of REPEAT decode rates (reply tokens after the first over the
    time after it): Seedbar with and without prompt lookup, llama-server plain and with each of
    its n-gram speculation types; whether Seedbar's two replies were the same."""
    cores = str(os.cpu_count() or 2)
    peers = {"plain": [], "ngram-simple": ["--spec-type", "ngram-simple"], "ngram-mod": ["--spec-type", "ngram-mod"]}
    repack = repack_flags(llama_bin, gguf, cores)

    def best(url, model, prompt, fields):
        return best_decode(url, model, prompt, SPECULATIVE_TOKENS, fields)

    print(f"Speculative decoding, one chat, same GGUF, up to {SPECULATIVE_TOKENS} tokens, decode tok/s (best of {REPEAT})")
    rows = {name: {} for name, _, _ in SPECULATIVE_WORKLOADS}
    seedbar_port = free_port()
    with running([str(seedbar_bin), "serve", "--model", str(gguf), "--port", str(seedbar_port),
                  "--max-context", str(CONTEXT), "--past-trained-context"], seedbar_port) as ours:
        model = httpx.get(ours + "/v1/models").json()["data"][0]["id"]
        for name, prompt, fields in SPECULATIVE_WORKLOADS:
            prompt = prompt or prompts[1]
            best(ours, model, prompt, fields)  # warm-up
            on = best(ours, model, prompt, fields)
            off = best(ours, model, prompt, {**fields, "speculative": False})
            rows[name].update(seedbar=on[0], seedbar_plain=off[0], tokens=on[1], identical=on[2] == off[2])
    for peer, extra in peers.items():
        port = free_port()
        argv = [str(llama_bin), "-m", str(gguf), "--port", str(port), "-np", "1", "-t", cores, "-c", "4096", *repack, *extra]
        with running(argv, port) as url:
            for name, prompt, fields in SPECULATIVE_WORKLOADS:
                prompt = prompt or prompts[1]
                best(url, model, prompt, fields)
                rows[name][peer] = best(url, model, prompt, fields)[0]
    print(f"{'workload':<16}{'tokens':>7}{'seedbar':>9}{'no spec':>9}{'llama':>8}{'ngram-simple':>13}{'ngram-mod':>10}"
          f"{'vs no spec':>11}{'vs best llama':>14}{'plain vs plain':>15}{'same reply':>11}")
    for name, r in rows.items():
        peer_best = max(r["plain"], r["ngram-simple"], r["ngram-mod"])
        print(f"{name:<16}{r['tokens']:>7}{r['seedbar']:>9.1f}{r['seedbar_plain']:>9.1f}{r['plain']:>8.1f}"
              f"{r['ngram-simple']:>13.1f}{r['ngram-mod']:>10.1f}{r['seedbar'] / r['seedbar_plain']:>10.2f}x"
              f"{r['seedbar'] / peer_best:>13.2f}x{r['seedbar_plain'] / r['plain']:>14.2f}x{str(r['identical']):>11}")


# A target for draft models: the GGUF with this many times its blocks, the ones added silent
# (tests/gguf_checkpoints.py's `write_deeper_gguf`: the same logits at that many times the
# cost), which the GGUF itself then drafts for as a small model of the family would.
DRAFT_TARGET_DEPTH = 6
DRAFT_TOKENS = 256


def draft_model(seedbar_bin: Path, llama_bin: Path, gguf: Path, prompts: list) -> None:
    """One chat per workload (greedy and sampled plain chats, where prompt lookup has little to
    draft), best of REPEAT decode rates: Seedbar with prompt lookup alone and with the draft
    model too (`--draft-model`), llama-server plain and with the same draft model (`-md`), on
    the same two GGUF files; whether Seedbar's replies with and without the draft model were
    the same."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from gguf_checkpoints import write_deeper_gguf

    cores = str(os.cpu_count() or 2)
    repack = repack_flags(llama_bin, gguf, cores)
    workloads = [("chat, greedy", prompts[1], {"temperature": 0.0}), ("chat, t0.8", prompts[2], {})]

    def best(url, model, prompt, fields):
        rate, _, text = best_decode(url, model, prompt, DRAFT_TOKENS, fields)
        return rate, text

    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "deeper.gguf"
        write_deeper_gguf(gguf, target, DRAFT_TARGET_DEPTH)
        print(f"Draft models, one chat, target {target.name} ({DRAFT_TARGET_DEPTH}x the blocks of {gguf.name}, the same "
              f"logits), draft {gguf.name}, up to {DRAFT_TOKENS} tokens, decode tok/s (best of {REPEAT})")
        rates, replies = {}, {}
        for side, extra in [("seedbar", []), ("seedbar+draft", ["--draft-model", str(gguf)])]:
            port = free_port()
            with running([str(seedbar_bin), "serve", "--model", str(target), "--port", str(port), *extra], port) as url:
                model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
                for name, prompt, fields in workloads:
                    best(url, model, prompt, fields)  # warm-up
                    rates[side, name], replies[side, name] = best(url, model, prompt, fields)
        for side, extra in [("llama", []), ("llama+draft", ["-md", str(gguf)])]:
            port = free_port()
            argv = [str(llama_bin), "-m", str(target), "--port", str(port), "-np", "1", "-t", cores, "-c", "4096", *repack, *extra]
            with running(argv, port) as url:
                for name, prompt, fields in workloads:
                    best(url, model, prompt, fields)
                    rates[side, name] = best(url, model, prompt, fields)[0]
    print(f"{'workload':<14}{'seedbar':>9}{'+draft':>8}{'llama':>8}{'+draft':>8}{'draft gain':>11}{'llama gain':>11}"
          f"{'vs llama+draft':>15}{'same reply':>11}")
    for name, _, _ in workloads:
        r = {side: rates[side, name] for side in ("seedbar", "seedbar+draft", "llama", "llama+draft")}
        same = replies["seedbar", name] == replies["seedbar+draft", name]
        print(f"{name:<14}{r['seedbar']:>9.1f}{r['seedbar+draft']:>8.1f}{r['llama']:>8.1f}{r['llama+draft']:>8.1f}"
              f"{r['seedbar+draft'] / r['seedbar']:>10.2f}x{r['llama+draft'] / r['llama']:>10.2f}x"
              f"{r['seedbar+draft'] / r['llama+draft']:>14.2f}x{str(same):>11}")
