"""A bounded loopback load test of `seedbar serve`: 32 concurrent streaming clients for
SEEDBAR_LOAD_SECONDS (default 30 in `make test`; `make soak` runs it for 600). Every stream must end cleanly, none may get stuck, each must
give exactly the text its (prompt, seed) gives alone (no token leaks between streams), and the
server must end idle with its memory back near the warmed-up baseline."""

import asyncio
import os
import time

import httpx
import pytest

from chat_stream import read_chat_stream
from conftest import DEFAULT_MODEL, serving

CLIENTS = 32
DURATION = float(os.environ.get("SEEDBAR_LOAD_SECONDS", "30"))
REQUEST_TIMEOUT = 120
MAX_TOKENS = 24
TOPICS = ["the sea", "a mountain", "coffee", "a robot", "winter", "a library", "trains", "the desert"]
# Eight (prompt, seed) pairs, each prompt carrying its own marker.
KEEP_ALIVES = [0]  # SSE comment lines seen
PAIRS = [(f"[marker Q{i}Z] Write two sentences about {topic}.", 1000 + 17 * i) for i, topic in enumerate(TOPICS)]


@pytest.fixture(scope="module")
def load_server(seedbar):
    with serving(seedbar) as srv:  # its own process, so RSS and counters are this test's alone
        yield srv


async def stream_once(client, prompt, seed):
    """One streamed chat; returns (text, finish_reason, completion_tokens) or raises."""
    body = {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0.8,
        "max_tokens": MAX_TOKENS,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise AssertionError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        stream = await read_chat_stream(resp, seed)
    KEEP_ALIVES[0] += stream.keep_alives
    stream.check_finished()
    return stream.text, stream.finish, stream.usage["completion_tokens"]


async def timed(client, prompt, seed):
    return await asyncio.wait_for(stream_once(client, prompt, seed), REQUEST_TIMEOUT)


def new_client(server):
    limits = httpx.Limits(max_connections=CLIENTS * 2, max_keepalive_connections=CLIENTS * 2)
    return httpx.AsyncClient(base_url=server.url, timeout=REQUEST_TIMEOUT, limits=limits)


def test_load(load_server, capsys):
    server = load_server

    async def references():
        async with new_client(server) as client:
            return [await timed(client, p, s) for p, s in PAIRS]

    refs = asyncio.run(references())
    reference = {pair: text for pair, (text, _, _) in zip(PAIRS, refs)}
    assert all(reference.values()), reference
    assert len(set(reference.values())) == len(PAIRS), "distinct prompts should give distinct texts"

    async def warm_up():
        async with new_client(server) as client:
            return await asyncio.gather(*(timed(client, *PAIRS[i % len(PAIRS)]) for i in range(CLIENTS)),
                                        return_exceptions=True)

    warm = asyncio.run(warm_up())
    warm_errors = [w for w in warm if isinstance(w, BaseException)]
    assert not warm_errors, warm_errors[:3]
    server.wait_idle(timeout=30)
    baseline_rss = server.rss_bytes()

    results = []  # (client, pair index, text, finish, tokens, seconds)
    errors = []  # (client, pair index, error)

    async def run_client(client, index, deadline):
        turn = index
        while time.monotonic() < deadline:
            pair_index = turn % len(PAIRS)
            prompt, seed = PAIRS[pair_index]
            started = time.monotonic()
            try:
                text, finish, tokens = await timed(client, prompt, seed)
            except asyncio.TimeoutError:
                errors.append((index, pair_index, f"stuck: no completion within {REQUEST_TIMEOUT}s"))
                return
            except Exception as exc:  # noqa: BLE001 - every failure is collected and reported
                errors.append((index, pair_index, repr(exc)))
                return
            results.append((index, pair_index, text, finish, tokens, time.monotonic() - started))
            turn += 1

    async def load():
        async with new_client(server) as client:
            deadline = time.monotonic() + DURATION
            await asyncio.gather(*(run_client(client, i, deadline) for i in range(CLIENTS)))

    started = time.monotonic()
    asyncio.run(load())
    elapsed = time.monotonic() - started

    idle = server.wait_idle(timeout=30)
    time.sleep(2)  # idle time before reading memory, as specified; not a synchronisation point
    final_rss = server.rss_bytes()
    metrics = server.metrics()

    mismatches = [(c, i, text) for c, i, text, *_ in results if text != reference[PAIRS[i]]]
    tokens = sum(r[4] for r in results)
    slowest = max((r[5] for r in results), default=0.0)
    with capsys.disabled():
        print(
            f"\n[load] {CLIENTS} clients, {elapsed:.1f}s: {len(results)} requests, {tokens} tokens "
            f"({tokens / elapsed:.1f} tok/s), slowest request {slowest:.1f}s, {len(errors)} errors, "
            f"{len(mismatches)} mismatches, {KEEP_ALIVES[0]} keep-alive comments; RSS baseline {baseline_rss / 2**20:.1f} MiB, "
            f"final {final_rss / 2**20:.1f} MiB"
        )

    assert not errors, errors[:5]
    assert results, "no request completed"
    assert len({r[0] for r in results}) == CLIENTS, "some clients completed nothing"
    for client_index, pair_index, text in mismatches[:3]:
        prompt, seed = PAIRS[pair_index]
        pytest.fail(
            f"client {client_index}: {prompt!r} seed {seed} gave {text!r} under load, "
            f"{reference[PAIRS[pair_index]]!r} alone ({len(mismatches)} mismatches in all)"
        )
    assert all(r[3] in ("stop", "length") for r in results)
    assert idle["seedbar_running_rows"] == 0 and idle["seedbar_queued_requests"] == 0
    assert metrics["seedbar_running_rows"] == 0 and metrics["seedbar_queued_requests"] == 0
    assert final_rss <= baseline_rss * 1.3 + 64 * 2**20, (baseline_rss, final_rss)
