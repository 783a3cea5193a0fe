#!/usr/bin/env python3
"""A soak of `seedbar serve`: CONCURRENCY workers (asyncio + httpx; raw sockets for
disconnects and oversize uploads) kept busy for SECONDS with a seeded random mix of

  stream      seeded streamed /v1/chat/completions: the text must equal the solo reference
  nonstream   the same, not streamed
  ollama      seeded /api/chat (NDJSON or one object): equal to its solo reference
  cancel      a long stream (on /v1 or /api) closed after a few chunks
  disconnect  a raw socket closed without reading: after the request, mid-body, or with a reset
  malformed   bad JSON, wrong types, bad values, an unknown model: the expected 4xx with the
              route family's JSON error
  oversize    a body over the server's 1 MiB limit (with a length, or chunked), sent from a
              thread while the answer is read: 413 with the JSON error. Only a chunked upload
              that the server resets before any answer arrives may go unanswered (counted as
              `closed`, reported, tolerated: once it stops reading, a reset can drop the 413)

A good request answered 429 (queue_full: more clients than rows + queue) is an expected
outcome, counted and reported, not an error; every good request served must match.

References are taken first, each (prompt, seed) alone and streamed, one at a time (the first
of each route also not streamed: both must agree).
A warm-up (a burst, then the same mix) follows; then the server is waited idle and its RSS read (the baseline);
then the soak; then it must be idle again within IDLE_TIMEOUT (`seedbar_running_rows` and
`seedbar_queued_requests` both 0), its RSS at most RSS_FACTOR x baseline + RSS_SLACK (1.5x +
200 MiB: generous for allocator and MLX buffer-cache growth, far below what a per-request
leak over thousands of requests gives), and one reference answered as before.

    python tests/soak.py [--url URL --pid PID] [--concurrency 64] [--seconds 600] [--seed 1] [--prompts 4]

Without --url it starts its own `target/debug/seedbar serve` on a free port with an isolated
SEEDBAR_HOME holding the default model. It prints a summary table and exits 1 on any failure.
Importable: `run_soak(url, pid, ...)` returns the same figures as a dict (`failures` lists what
went wrong)."""

import argparse
import asyncio
import json
import random
import socket
import struct
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat_stream import read_chat_stream  # noqa: E402
from conftest import DEFAULT_MODEL, Seedbar, default_gguf, parse_metrics, serving, wait_for  # noqa: E402

MAX_TOKENS = 24
TEMPERATURE = 0.8
REQUEST_TIMEOUT = 300  # "stuck" after this long: at 64 clients on 2 cores a good request can wait ~2 min
IDLE_TIMEOUT = 60
RSS_FACTOR = 1.5
RSS_SLACK = 200 * 2**20
BODY_LIMIT = 1 << 20  # the --max-body-bytes the soak's own server runs with
EOS_BAN = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|>: a cancel's stream runs long
TOPICS = ["the sea", "a mountain", "coffee", "a robot"]
PROMPTS = [f"[soak P{i}] Write two sentences about {topic}." for i, topic in enumerate(TOPICS)]
SEEDS = [11, 2024]
PAIRS = [(p, s) for p in PROMPTS for s in SEEDS]  # for /v1/chat/completions
OLLAMA_PAIRS = [(p, 500 + i) for i, p in enumerate(PROMPTS)]  # for /api/chat
WEIGHTS = {"stream": 30, "nonstream": 14, "ollama": 12, "cancel": 10, "disconnect": 10, "malformed": 16,
           "oversize": 8}
KEEP = 20  # distinct error and mismatch details kept per kind


class Unexpected(Exception):
    """A response the soak did not expect (counted as an error of its kind)."""


@dataclass
class KindStats:
    count: int = 0
    ok: int = 0
    queue_full: int = 0
    closed: int = 0  # oversize chunked uploads reset before any answer (tolerated, reported)
    errors: int = 0
    mismatches: int = 0
    tokens: int = 0
    slowest: float = 0.0
    details: dict = field(default_factory=dict)  # distinct problems (up to KEEP) -> times seen

    def note(self, text):
        if text in self.details or len(self.details) < KEEP:
            self.details[text] = self.details.get(text, 0) + 1


class Stats:
    def __init__(self):
        self.kinds = {kind: KindStats() for kind in WEIGHTS}

    def totals(self):
        k = self.kinds.values()
        return {name: sum(getattr(s, name) for s in k)
                for name in ("count", "ok", "queue_full", "closed", "errors", "mismatches", "tokens")}

    def as_dict(self):
        return {kind: {**s.__dict__, "slowest": round(s.slowest, 2)} for kind, s in self.kinds.items()}


# --- requests ---------------------------------------------------------------------------------


def chat_body(prompt, seed, stream, max_tokens=MAX_TOKENS, **extra):
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": prompt}], "temperature": TEMPERATURE,
            "max_tokens": max_tokens, "seed": seed, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return body


def ollama_body(prompt, seed, stream, num_predict=MAX_TOKENS):
    return {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": prompt}], "stream": stream,
            "options": {"seed": seed, "temperature": TEMPERATURE, "num_predict": num_predict}}


def error_of(status, raw, shape):
    """The parsed error body if `raw` is the route family's JSON error; else raises Unexpected."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise Unexpected(f"HTTP {status} with a body that is not JSON: {raw[:200]!r}") from None
    error = body.get("error") if isinstance(body, dict) else None
    if shape == "ollama":
        if not (isinstance(error, str) and error):
            raise Unexpected(f"HTTP {status}: not Ollama's error shape: {raw[:200]!r}")
        return body
    if not (isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str)):
        raise Unexpected(f"HTTP {status}: not OpenAI's error shape: {raw[:200]!r}")
    return body


class QueueFull(Exception):
    pass


def refused(status, raw, shape):
    """A non-200 answer to a good request: QueueFull for a proper 429, else Unexpected."""
    body = error_of(status, raw, shape)
    if status == 429:
        code = body["error"].get("code") if shape == "openai" else "queue_full"
        if code != "queue_full":
            raise Unexpected(f"429 without code queue_full: {raw[:200]!r}")
        raise QueueFull()
    raise Unexpected(f"HTTP {status}: {raw[:300]!r}")


async def sse_chat(client, body, stop_after=None):
    """A streamed chat completion: (text, completion tokens, data chunks); with `stop_after`,
    closes the stream after that many data chunks."""
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            refused(resp.status_code, await resp.aread(), "openai")
        if resp.headers.get("x-seedbar-seed") != str(body["seed"]):
            raise Unexpected(f"x-seedbar-seed {resp.headers.get('x-seedbar-seed')!r} for seed {body['seed']}")
        stream = await read_chat_stream(resp, body["seed"], stop_after)
    if stop_after is not None:
        return stream.text, stream.chunks, stream.chunks
    stream.check_finished()
    return stream.text, stream.usage["completion_tokens"], stream.chunks


async def plain_chat(client, body):
    resp = await client.post("/v1/chat/completions", json=body)
    if resp.status_code != 200:
        refused(resp.status_code, resp.content, "openai")
    obj = resp.json()
    if obj.get("seed") != body["seed"] or resp.headers.get("x-seedbar-seed") != str(body["seed"]):
        raise Unexpected(f"seed {obj.get('seed')} / header {resp.headers.get('x-seedbar-seed')} != {body['seed']}")
    choice = obj["choices"][0]
    if choice["finish_reason"] not in ("stop", "length"):
        raise Unexpected(f"finish_reason {choice['finish_reason']!r}")
    return choice["message"]["content"] or "", obj["usage"]["completion_tokens"]


async def ollama_chat(client, body, stop_after=None):
    """/api/chat: (text, eval_count); streamed as NDJSON when body["stream"]."""
    if not body["stream"]:
        resp = await client.post("/api/chat", json=body)
        if resp.status_code != 200:
            refused(resp.status_code, resp.content, "ollama")
        obj = resp.json()
        if not obj.get("done") or obj.get("done_reason") not in ("stop", "length"):
            raise Unexpected(f"not a finished reply: {resp.text[:300]}")
        return obj["message"]["content"], obj["eval_count"]
    async with client.stream("POST", "/api/chat", json=body) as resp:
        if resp.status_code != 200:
            refused(resp.status_code, await resp.aread(), "ollama")
        parts, final, lines = [], None, 0
        async for line in resp.aiter_lines():
            if not line:
                continue
            obj = json.loads(line)
            if "error" in obj:
                raise Unexpected(f"error line mid-stream: {line[:300]}")
            if final is not None:
                raise Unexpected("a line after done: true")
            lines += 1
            parts.append(obj.get("message", {}).get("content", ""))
            if obj.get("done"):
                final = obj
            if stop_after is not None and lines >= stop_after:
                return "".join(parts), lines
    if stop_after is not None:
        return "".join(parts), lines
    if final is None or final.get("done_reason") not in ("stop", "length"):
        raise Unexpected(f"NDJSON ended without a finished line: {final!r}")
    return "".join(parts), final["eval_count"]


# --- the mix ----------------------------------------------------------------------------------


@dataclass
class Context:
    url: str
    host: str
    port: int
    client: httpx.AsyncClient
    references: dict  # ("v1" | "ollama", prompt, seed) -> text
    oversize: bytes
    pairs: list
    ollama_pairs: list
    pool: ThreadPoolExecutor  # for the blocking oversize uploads


async def do_stream(ctx, rng, what):
    prompt, seed = rng.choice(ctx.pairs)
    what.append(f"streamed chat {prompt[:10]!r} seed {seed}")
    text, tokens, _ = await sse_chat(ctx.client, chat_body(prompt, seed, True))
    return ("v1", prompt, seed), text, tokens


async def do_nonstream(ctx, rng, what):
    prompt, seed = rng.choice(ctx.pairs)
    what.append(f"chat {prompt[:10]!r} seed {seed}")
    text, tokens = await plain_chat(ctx.client, chat_body(prompt, seed, False))
    return ("v1", prompt, seed), text, tokens


async def do_ollama(ctx, rng, what):
    prompt, seed = rng.choice(ctx.ollama_pairs)
    stream = rng.random() < 0.6
    what.append(f"/api/chat {prompt[:10]!r} seed {seed} stream {stream}")
    text, tokens = await ollama_chat(ctx.client, ollama_body(prompt, seed, stream))
    return ("ollama", prompt, seed), text, tokens


async def do_cancel(ctx, rng, what):
    prompt, seed = rng.choice(ctx.pairs)
    after = rng.randint(1, 6)
    on_v1 = rng.random() < 0.75
    what.append(f"cancel on {'/v1' if on_v1 else '/api'} after {after} chunks")
    if on_v1:
        body = chat_body(prompt, seed, True, max_tokens=300, logit_bias=EOS_BAN)
        _, got, _ = await sse_chat(ctx.client, body, stop_after=after)
    else:
        body = ollama_body(prompt, seed, True, num_predict=300)
        _, got = await ollama_chat(ctx.client, body, stop_after=after)
    return None, None, got


async def do_disconnect(ctx, rng, what):
    prompt, seed = rng.choice(ctx.pairs)
    stream = rng.random() < 0.5
    path, body = ("/v1/chat/completions", chat_body(prompt, seed, stream, max_tokens=200, logit_bias=EOS_BAN))
    if rng.random() < 0.3:
        path, body = "/api/chat", ollama_body(prompt, seed, stream, num_predict=200)
    raw = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {ctx.host}:{ctx.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n").encode()
    how = rng.choice(["after_request", "after_request", "mid_body", "after_headers"])
    what.append(f"disconnect {how} on {path}")
    sent = {"after_request": head + raw, "mid_body": head + raw[: len(raw) // 2], "after_headers": head}[how]
    reader, writer = await asyncio.open_connection(ctx.host, ctx.port)
    try:
        writer.write(sent)
        await writer.drain()
        await asyncio.sleep(rng.uniform(0, 0.5))  # the request may reach a row, or not
        if rng.random() < 0.5:  # close with a reset instead of a FIN
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass
    return None, None, 0


BAD_JSON = [b'{"model": "x", "messages": [', b"not json", b"", b'{"model": ' + b"[" * 300, b"\xff\xfe{}",
            b'{"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2} trailing']


def malformed_cases():
    """(path, body bytes, expected status, error shape)."""
    good = [{"role": "user", "content": "hi"}]
    cases = [("/v1/chat/completions", b, 400, "openai") for b in BAD_JSON]
    cases += [("/api/chat", b, 400, "ollama") for b in BAD_JSON[:3]]
    bodies = [
        ("/v1/chat/completions", {"model": DEFAULT_MODEL, "messages": "hi"}, 400, "openai"),
        ("/v1/chat/completions", {"model": 7, "messages": good}, 400, "openai"),
        ("/v1/chat/completions", {"model": DEFAULT_MODEL, "messages": good, "max_tokens": "ten"}, 400, "openai"),
        ("/v1/chat/completions", {"model": DEFAULT_MODEL, "messages": good, "temperature": 5}, 400, "openai"),
        ("/v1/chat/completions", {"model": DEFAULT_MODEL, "messages": []}, 400, "openai"),
        ("/v1/chat/completions", {"model": DEFAULT_MODEL}, 400, "openai"),
        ("/v1/chat/completions", {"model": "no-such-model", "messages": good}, 404, "openai"),
        ("/v1/completions", {"model": DEFAULT_MODEL, "prompt": {"a": 1}}, 400, "openai"),
        ("/v1/completions", {"model": "no-such-model", "prompt": "hi"}, 404, "openai"),
        ("/api/chat", {"model": DEFAULT_MODEL, "messages": good, "options": {"num_predict": "x"}}, 400, "ollama"),
        ("/api/chat", {"model": DEFAULT_MODEL, "messages": [{"role": "bogus", "content": "hi"}]}, 400, "ollama"),
        ("/api/chat", {"model": "no-such-model", "messages": good}, 404, "ollama"),
        ("/api/generate", {"model": "no-such-model", "prompt": "hi"}, 404, "ollama"),
    ]
    return cases + [(p, json.dumps(b).encode(), s, shape) for p, b, s, shape in bodies]


MALFORMED = malformed_cases()


async def do_malformed(ctx, rng, what):
    path, raw, status, shape = rng.choice(MALFORMED)
    what.append(f"{path} {raw[:100]!r}")
    resp = await ctx.client.post(path, content=raw, headers={"Content-Type": "application/json"})
    if resp.status_code != status:
        raise Unexpected(f"{path} {raw[:80]!r}: expected {status}, got {resp.status_code}: {resp.text[:200]!r}")
    error_of(resp.status_code, resp.content, shape)
    return None, None, 0


class ClosedUnanswered(Exception):
    """The server reset a chunked oversize upload before any answer arrived (tolerated: the
    413 could not be delivered once the server stopped reading; counted as `closed`)."""


def oversize_exchange(host, port, path, body, chunked, timeout=60):
    """POSTs `body` over a blocking socket, sending from a thread while reading the answer (a
    client that reads only after sending loses a 413 sent early to the reset that follows):
    (raw answer, send error, read error)."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"{framing}\r\nConnection: close\r\n\r\n").encode()
    sock = socket.create_connection((host, port), timeout=timeout)
    errors = {}

    def send():
        try:
            sock.sendall(head)
            for i in range(0, len(body), 64 * 1024):
                piece = body[i : i + 64 * 1024]
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except OSError as exc:
            errors["send"] = exc

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    answer = b""
    try:
        while not answer_complete(answer):
            got = sock.recv(64 * 1024)
            if not got:
                break
            answer += got
    except OSError as exc:
        errors["read"] = exc
    finally:
        sender.join(5)
        sock.close()
    return answer, errors.get("send"), errors.get("read")


def answer_complete(raw):
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(rest) >= int(value)
    return False  # read to the end


async def do_oversize(ctx, rng, what):
    path = rng.choice(["/v1/chat/completions", "/v1/completions", "/app/conversations", "/api/chat"])
    chunked = rng.random() < 0.4  # no Content-Length: the limit must stop the body as it streams in
    how = "chunked" if chunked else "with a length"
    what.append(f"{len(ctx.oversize)} bytes {how} to {path}")
    loop = asyncio.get_running_loop()
    raw, send_error, read_error = await loop.run_in_executor(
        ctx.pool, oversize_exchange, ctx.host, ctx.port, path, ctx.oversize, chunked)
    if not raw:
        if chunked and send_error is not None:
            raise ClosedUnanswered()
        raise Unexpected(f"no answer, the connection closed (send: {send_error!r}, read: {read_error!r})")
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0]
    if not status_line.startswith(b"HTTP/1.1 413 "):
        raise Unexpected(f"expected 413, got {status_line[:60]!r}: {body[:200]!r} (read: {read_error!r})")
    if not answer_complete(raw):
        raise Unexpected(f"a 413 cut short: {raw[:300]!r} (read: {read_error!r})")
    error_of(413, body, "ollama" if path.startswith("/api/") else "openai")
    return None, None, 0


ACTIONS = {"stream": do_stream, "nonstream": do_nonstream, "ollama": do_ollama, "cancel": do_cancel,
           "disconnect": do_disconnect, "malformed": do_malformed, "oversize": do_oversize}


async def one(ctx, kind, rng, stats):
    s = stats.kinds[kind]
    s.count += 1
    started = time.monotonic()
    what = []
    try:
        key, text, tokens = await asyncio.wait_for(ACTIONS[kind](ctx, rng, what), REQUEST_TIMEOUT)
    except QueueFull:
        s.queue_full += 1
        return
    except ClosedUnanswered:
        s.closed += 1
        return
    except asyncio.TimeoutError:
        s.errors += 1
        s.note(f"stuck: no answer within {REQUEST_TIMEOUT}s ({' '.join(what)})")
        return
    except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
        s.errors += 1
        s.note(f"{' '.join(what)}: {type(exc).__name__}: {exc}"[:600])
        return
    finally:
        s.slowest = max(s.slowest, time.monotonic() - started)
    s.tokens += tokens
    if key is not None and text != ctx.references[key]:
        s.mismatches += 1
        s.note(f"mismatch {key}: got {text!r}, alone {ctx.references[key]!r}")
        return
    s.ok += 1


async def worker(ctx, index, deadline, stats, seed, phase, plan=None):
    """Runs the seeded mix until `deadline`; with a `plan`, runs that kind once instead."""
    rng = random.Random(f"{seed}/{phase}/{index}")
    if plan is not None:
        await one(ctx, plan, rng, stats)
        return
    kinds, weights = list(WEIGHTS), list(WEIGHTS.values())
    while time.monotonic() < deadline:
        await one(ctx, rng.choices(kinds, weights)[0], rng, stats)


def new_client(url, concurrency):
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
    return httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT, limits=limits)


def oversize_body():
    filler = "x" * (BODY_LIMIT + 64 * 1024)
    return json.dumps({"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": filler}]}).encode()


# The warm-up burst: a full batch of rows (8) of good requests, and one of each other kind.
BURST = ["stream"] * 6 + ["nonstream", "ollama", "cancel", "disconnect", "malformed", "oversize"]


async def run_phase(url, references, concurrency, seconds, seed, phase, plan=None):
    """`concurrency` workers on the mix for `seconds` (then the requests under way finish), or
    one worker per kind in `plan`, at once."""
    stats = Stats()
    if plan is not None:
        concurrency = len(plan)
    parts = urlsplit(url)
    pairs = sorted({(p, s) for kind, p, s in references if kind == "v1"})
    ollama_pairs = sorted({(p, s) for kind, p, s in references if kind == "ollama"})
    async with new_client(url, concurrency) as client:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            ctx = Context(url, parts.hostname, parts.port, client, references, oversize_body(), pairs, ollama_pairs,
                          pool)
            deadline = time.monotonic() + seconds
            await asyncio.gather(*(worker(ctx, i, deadline, stats, seed, phase, plan and plan[i])
                                   for i in range(concurrency)))
    return stats


async def take_references(url, prompts, seeds=len(SEEDS), solo_modes=True):
    """Each (prompt, seed) of the first `prompts` prompts alone, one at a time, streamed (with
    `solo_modes`, the first of each route also not streamed: both must agree; the soak compares
    non-streamed replies with the streamed references anyway): (references, failures)."""
    references, failures = {}, []
    async with new_client(url, 2) as client:
        for i, (prompt, seed) in enumerate((p, s) for p, s in PAIRS if p in PROMPTS[:prompts] and s in SEEDS[:seeds]):
            text, _, _ = await sse_chat(client, chat_body(prompt, seed, True))
            references[("v1", prompt, seed)] = text
            whole = (await plain_chat(client, chat_body(prompt, seed, False)))[0] if solo_modes and i == 0 else text
            if whole != text:
                failures.append(f"reference {prompt!r} seed {seed}: streamed {text!r}, not streamed {whole!r}")
        for i, (prompt, seed) in enumerate(OLLAMA_PAIRS[:prompts]):
            text, _ = await ollama_chat(client, ollama_body(prompt, seed, True))
            references[("ollama", prompt, seed)] = text
            whole = (await ollama_chat(client, ollama_body(prompt, seed, False)))[0] if solo_modes and i == 0 else text
            if whole != text:
                failures.append(f"ollama reference {prompt!r} seed {seed}: NDJSON {text!r}, one object {whole!r}")
    empty = [k for k, v in references.items() if not v.strip()]
    if empty:
        failures.append(f"empty references: {empty}")
    if len(set(references.values())) < len(references) // 2:
        failures.append("the references hardly differ: are seeds and prompts used?")
    return references, failures


# --- the server -------------------------------------------------------------------------------


def rss_bytes(pid):
    """Resident memory of `pid` (psutil, on Linux and macOS alike)."""
    return psutil.Process(pid).memory_info().rss


def metrics(url):
    return parse_metrics(httpx.get(url + "/metrics", timeout=30).text)


def wait_idle(url, timeout):
    """The metrics once no row runs and nothing is queued, or None after `timeout` seconds."""

    def idle():
        m = metrics(url)
        return m if m.get("seedbar_running_rows") == 0 and m.get("seedbar_queued_requests") == 0 else None

    try:
        return wait_for(idle, timeout, interval=0.2, message="an idle server")
    except AssertionError:
        return None


def run_soak(url, pid=None, concurrency=64, seconds=600.0, seed=1, warmup=None, prompts=len(PROMPTS),
             seeds=len(SEEDS), solo_modes=True, out=print):
    """Soaks the server at `url` (its process `pid`, for RSS) with the first `prompts` prompts
    (x the first `seeds` seeds on /v1, x 1 on /api) and returns the figures; it passed when `failures` is empty.
    The warm-up is a burst (BURST) then `warmup` seconds of the mix (default: a tenth of
    `seconds`, 5 to 30)."""
    url = url.rstrip("/").removesuffix("/v1")
    warmup = min(30.0, max(5.0, seconds / 10)) if warmup is None else warmup
    failures = []
    started = time.monotonic()
    references, problems = asyncio.run(take_references(url, prompts, seeds, solo_modes))
    failures += problems
    reference_seconds = time.monotonic() - started
    out(f"[soak] {len(references)} references in {reference_seconds:.1f}s; warm-up: a burst, then {warmup:.0f}s "
        f"at concurrency {concurrency}")

    warm = asyncio.run(run_phase(url, references, concurrency, 0, seed, "burst", plan=BURST))
    if warmup > 0:
        more = asyncio.run(run_phase(url, references, concurrency, warmup, seed, "warm-up"))
        for kind, s in more.kinds.items():
            into = warm.kinds[kind]
            for name in ("count", "ok", "queue_full", "closed", "errors", "mismatches", "tokens"):
                setattr(into, name, getattr(into, name) + getattr(s, name))
            into.slowest = max(into.slowest, s.slowest)
            for text, n in s.details.items():
                into.details[text] = into.details.get(text, 0) + n
    if wait_idle(url, IDLE_TIMEOUT) is None:
        failures.append(f"not idle {IDLE_TIMEOUT}s after the warm-up")
    rss_before = rss_bytes(pid) if pid else None
    before = metrics(url)

    out(f"[soak] soaking {seconds:.0f}s at concurrency {concurrency} (seed {seed})")
    soak_started = time.monotonic()
    stats = asyncio.run(run_phase(url, references, concurrency, seconds, seed, "soak"))
    elapsed = time.monotonic() - soak_started

    idle = wait_idle(url, IDLE_TIMEOUT)
    if idle is None:
        m = metrics(url)
        failures.append(f"rows left running {IDLE_TIMEOUT}s after the soak: seedbar_running_rows "
                        f"{m.get('seedbar_running_rows')}, seedbar_queued_requests {m.get('seedbar_queued_requests')}")
        idle = m
    time.sleep(2)
    rss_after = rss_bytes(pid) if pid else None
    rss_limit = rss_before * RSS_FACTOR + RSS_SLACK if pid else None
    if pid and rss_after > rss_limit:
        failures.append(f"RSS grew from {rss_before / 2**20:.0f} MiB to {rss_after / 2**20:.0f} MiB "
                        f"(limit {rss_limit / 2**20:.0f} MiB)")

    async def again():
        async with new_client(url, 2) as client:
            prompt, seed_ = PAIRS[0]
            return (await sse_chat(client, chat_body(prompt, seed_, True)))[0]

    try:
        after_text = asyncio.run(again())
        if after_text != references[("v1", *PAIRS[0])]:
            failures.append(f"after the soak {PAIRS[0]} gave {after_text!r}, before {references[('v1', *PAIRS[0])]!r}")
    except Exception as exc:  # noqa: BLE001
        failures.append(f"after the soak a good request failed: {exc!r}")

    for phase, st in (("warm-up", warm), ("soak", stats)):
        for kind, s in st.kinds.items():
            if s.errors or s.mismatches:
                seen = "".join(f"\n    {n}x {text}" for text, n in list(s.details.items())[:6])
                failures.append(f"{phase} {kind}: {s.errors} errors, {s.mismatches} mismatches:{seen}")
    totals = stats.totals()
    if totals["ok"] == 0:
        failures.append("no request of the soak completed")

    generated = idle.get("seedbar_generated_tokens_total", 0) - before.get("seedbar_generated_tokens_total", 0)
    result = {
        "concurrency": concurrency, "seconds": seconds, "seed": seed, "elapsed": round(elapsed, 1),
        "kinds": stats.as_dict(), "warmup_kinds": warm.as_dict(), **totals,
        "requests_per_second": round(totals["count"] / elapsed, 2),
        "server_generated_tokens": int(generated), "server_tokens_per_second": round(generated / elapsed, 1),
        "rss_before": rss_before, "rss_after": rss_after, "rss_limit": rss_limit,
        "running_rows_after": idle.get("seedbar_running_rows"), "queued_after": idle.get("seedbar_queued_requests"),
        "failures": failures,
    }
    out(summary(result))
    return result


def summary(r):
    mib = lambda b: "n/a" if b is None else f"{b / 2**20:.0f} MiB"  # noqa: E731
    lines = [f"[soak] concurrency {r['concurrency']}, {r['elapsed']}s: {r['count']} requests "
             f"({r['requests_per_second']}/s), server {r['server_generated_tokens']} tokens "
             f"({r['server_tokens_per_second']} tok/s)",
             f"{'kind':<11}{'count':>7}{'ok':>7}{'429':>6}{'closed':>8}{'errors':>8}{'mismatch':>10}"
             f"{'tokens':>9}{'slowest':>9}"]
    for kind, s in r["kinds"].items():
        lines.append(f"{kind:<11}{s['count']:>7}{s['ok']:>7}{s['queue_full']:>6}{s['closed']:>8}{s['errors']:>8}"
                     f"{s['mismatches']:>10}{s['tokens']:>9}{s['slowest']:>8.1f}s")
    lines.append(f"{'total':<11}{r['count']:>7}{r['ok']:>7}{r['queue_full']:>6}{r['closed']:>8}{r['errors']:>8}"
                 f"{r['mismatches']:>10}{r['tokens']:>9}")
    lines.append(f"RSS before {mib(r['rss_before'])}, after {mib(r['rss_after'])} (limit {mib(r['rss_limit'])}); "
                 f"after: running rows {r['running_rows_after']}, queued {r['queued_after']}")
    lines.append("PASS" if not r["failures"] else "FAIL:\n  " + "\n  ".join(r["failures"]))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (its root, or .../v1); default: start one")
    parser.add_argument("--pid", type=int, help="the running server's process id (for RSS)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--warmup", type=float, help="seconds of warm-up (default: a tenth, 5-30 s)")
    parser.add_argument("--seed", type=int, default=1, help="seeds the workers' random mix")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), choices=range(1, len(PROMPTS) + 1),
                        help="how many of the prompts to use (x 2 seeds on /v1, x 1 on /api)")
    parser.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT,
                        help="seconds after which a request counts as stuck")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    globals()["REQUEST_TIMEOUT"] = args.request_timeout
    kwargs = dict(concurrency=args.concurrency, seconds=args.seconds, seed=args.seed, warmup=args.warmup,
                  prompts=args.prompts)
    if args.url:
        result = run_soak(args.url, args.pid, **kwargs)
    else:
        with tempfile.TemporaryDirectory(prefix="seedbar-soak-") as home:
            sb = Seedbar(Path(home))
            sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
            try:
                # SIGTERM at the end; it must exit 0
                with serving(sb, "--max-body-bytes", BODY_LIMIT) as srv:
                    print(f"[soak] started {srv.ready_line} (pid {srv.pid}, SEEDBAR_HOME {home})")
                    result = run_soak(srv.url, srv.pid, **kwargs)
            except AssertionError as exc:
                print(f"[soak] FAIL: {exc}")
                return 1
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
