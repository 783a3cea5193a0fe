"""Property-based fuzzing (hypothesis) of every request extractor of `seedbar serve`, against
the shared server: arbitrary JSON values, dicts built from each route's real field names with
values of the right or the wrong type, arbitrary bytes and mangled JSON, all sent as
`Content-Type: application/json` to every POST/PUT/PATCH route, plus arbitrary query strings
and path segments on the routes that take them. Every answer must come within TIMEOUT
seconds, never be a 5xx or a dropped connection, and every refusal must be a 4xx with the
route family's JSON error (OpenAI's `{"error": {"message", "type", ...}}` on /v1 and /app,
Ollama's `{"error": "..."}` on /api). Inputs that happen to be valid may succeed (generation
is forced down to one token so they stay cheap); nothing may make the server fail. Afterwards
the server must still answer a seeded chat exactly as before the fuzz.

Never sent: a valid `/app/models/pull` (every "/" is taken out of its inputs, so no repository
id is well formed and nothing is downloaded). `PUT /app/settings` may accept a generated body;
the settings are put back afterwards and checked."""

import base64
import copy
import json
import os
import re
import urllib.parse

import httpx
import pytest
from hypothesis import HealthCheck, currently_in_test_context, given, note, settings
from hypothesis import strategies as st

from conftest import CACHE, DEFAULT_MODEL

# Hypothesis keeps a Unicode cache: in the set-up's cache, not in the checkout (read lazily).
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(CACHE / "hypothesis"))

TIMEOUT = 30  # seconds for any answer, body included
EXAMPLES = 40  # per route and kind of input
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # no .hypothesis/ folder in the checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
JSON_HEADERS = {"Content-Type": "application/json"}

# --- values -----------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**65), 2**65)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=16)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=10,
)


def field(plausible):
    """A field's value: one of the right type (often valid), or any JSON value."""
    return st.one_of(plausible, json_values)


def fields(mapping, **extra):
    """A dict of some of a route's fields (each field right- or wrong-typed), sometimes with an
    unknown one."""
    optional = {name: field(strategy) for name, strategy in mapping.items()}
    optional.update(extra)
    optional.setdefault("not_a_field", json_values)
    return st.fixed_dictionaries({}, optional=optional)


text = st.text(max_size=16)
small_int = st.integers(-3, 10)
number = st.integers(-2, 4) | st.floats(-3, 5, allow_nan=False)
seed = st.integers(-(2**63), 2**64 - 1) | st.integers(0, 100)
model = st.sampled_from([DEFAULT_MODEL, DEFAULT_MODEL.lower(), f"{DEFAULT_MODEL}:latest", "no-such-model", ""]) | text
role = st.sampled_from(["system", "developer", "user", "assistant", "tool", "bogus", ""])
# Images: a real PNG, cut or spliced with random bytes, mislabelled, non-images, URLs that
# must not be fetched, paths that are not image files (a device, a folder, nothing).
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)
image_bytes = st.one_of(
    st.just(PNG),
    st.integers(0, len(PNG)).map(lambda n: PNG[:n]),
    st.tuples(st.integers(0, len(PNG)), st.binary(min_size=1, max_size=16)).map(lambda c: PNG[: c[0]] + c[1] + PNG[c[0]:]),
    st.binary(max_size=64),
)
media_type = st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/bmp", "text/plain", ""]) | text
image_url = st.one_of(
    st.builds(lambda t, b: f"data:{t};base64,{base64.b64encode(b).decode()}", media_type, image_bytes),
    st.sampled_from(["https://example.test/a.png", "/dev/zero", "/tmp", "file:///nonexistent.png", "data:,",
                     "data:image/png;base64,!!", "relative.png"]),
    text,
)
image_base64 = image_bytes.map(lambda b: base64.b64encode(b).decode()) | text
part = fields({"type": st.sampled_from(["text", "image_url"]) | text, "text": text,
               "image_url": fields({"url": image_url}) | image_url})
tool = st.fixed_dictionaries(
    {"type": st.just("function"), "function": fields({"name": text, "description": text, "parameters": json_values})}
)
stop = text | st.lists(text, max_size=5)

COMMON = {
    "model": model,
    "temperature": number,
    "top_p": number,
    "top_k": small_int,
    "min_p": number,
    "repetition_penalty": number,
    "presence_penalty": number,
    "frequency_penalty": number,
    "logit_bias": st.dictionaries(st.sampled_from(["0", "2", "50", "-1", "x", "99999999999"]), number, max_size=2),
    "seed": seed,
    "stop": stop,
    "max_tokens": small_int,
    "n": small_int,
    "stream": st.booleans(),
    "stream_options": fields({"include_usage": st.booleans()}),
}
OPENAI_MESSAGE = fields(
    {"role": role, "content": text | st.lists(part, max_size=3), "name": text,
     "tool_calls": st.lists(json_values, max_size=2), "tool_call_id": text}
)
CHAT = {
    **COMMON,
    "messages": st.lists(OPENAI_MESSAGE, max_size=3),
    "max_completion_tokens": small_int,
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(-1, 30),
    "tools": st.lists(tool | json_values, max_size=2),
    "tool_choice": st.sampled_from(["none", "auto", "required"]) | json_values,
}
COMPLETIONS = {
    **COMMON,
    "prompt": text
    | st.lists(text, max_size=3)
    | st.lists(st.integers(-5, 2**33), max_size=4)
    | st.lists(st.lists(st.integers(0, 70000), max_size=3), max_size=2),
    "suffix": text,
    "echo": st.booleans(),
    "logprobs": st.integers(-1, 30),
}
OPTIONS = fields(
    {"seed": seed, "temperature": number, "top_p": number, "top_k": small_int, "min_p": number,
     "num_predict": small_int, "stop": st.lists(text, max_size=3), "repeat_penalty": number,
     "presence_penalty": number, "frequency_penalty": number}
)
OLLAMA_MESSAGE = fields({"role": role, "content": text, "images": st.lists(image_base64, max_size=2),
                         "tool_calls": st.lists(json_values, max_size=2)})
OLLAMA_CHAT = {"model": model, "messages": st.lists(OLLAMA_MESSAGE, max_size=3), "stream": st.booleans(),
               "options": OPTIONS, "tools": st.lists(tool | json_values, max_size=2)}
OLLAMA_GENERATE = {"model": model, "prompt": text, "suffix": text, "system": text, "raw": st.booleans(),
                   "stream": st.booleans(), "options": OPTIONS, "images": st.lists(image_base64, max_size=2)}
OLLAMA_SHOW = {"model": model, "name": model}
SETTINGS_PATCH = fields(
    {"model": model, "system_prompt": text, "temperature": number, "top_p": number,
     "max_tokens": st.integers(-1, 2**33), "seed": st.none() | st.integers(-1, 2**54)}
)
CONVERSATION = {"title": text | st.just("   "), "settings": SETTINGS_PATCH}
NEW_CONVERSATION = {**CONVERSATION, "messages": st.lists(fields({
    "role": st.sampled_from(["user", "assistant", "system"]), "content": text,
    "seed": st.integers(-1, 2**64)}), max_size=2)}
REPLY = {"content": text, "images": st.lists(image_url, max_size=2), "regenerate": st.booleans(),
         "edit": fields({"message_id": st.integers(-1, 2**63), "content": text})}
PULL = {"repo": text | st.sampled_from(["org", "org|name", "..", ""])}
APP_SETTINGS = {
    "port": st.integers(-1, 70000),
    "api_key": text,
    "allowed_origins": st.lists(st.sampled_from(["http://localhost:5173", "not an origin"]) | text, max_size=2),
    "show_in_dock": st.booleans(),
    "launch_at_login": st.booleans(),
    "quick_chat_shortcut": text,
}

# --- keeping valid requests cheap -------------------------------------------------------------


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def one_token_openai(body):
    """Where a generated body could be a valid request, it asks for one token: `max_tokens`
    absent, null or a usable count becomes 1 (wrong types are left to be refused)."""
    if body.get("max_tokens") is None or (is_int(body["max_tokens"]) and body["max_tokens"] > 1):
        body["max_tokens"] = 1
    if is_int(body.get("max_completion_tokens")) and body["max_completion_tokens"] > 1:
        body["max_completion_tokens"] = 1
    return body


def one_token_ollama(body):
    """The same for Ollama: `options.num_predict` (absent or <= 0 means "until the context
    ends") becomes 1 unless it has a wrong type; `options: null` reads as absent."""
    if body.get("options") is None:
        body["options"] = {}
    options = body["options"]
    if isinstance(options, dict):
        n = options.get("num_predict")
        if n is None or (is_int(n) and -(2**63) <= n < 2**63):
            options["num_predict"] = 1
    return body


def without_slashes(value):
    """Every "/" replaced, so that no repository id (org/name) is ever well formed."""
    if isinstance(value, str):
        return value.replace("/", "|")
    if isinstance(value, list):
        return [without_slashes(v) for v in value]
    if isinstance(value, dict):
        return {without_slashes(k): without_slashes(v) for k, v in value.items()}
    return value


# --- routes -----------------------------------------------------------------------------------


class Route:
    """A POST/PUT/PATCH route: `fields` its body's fields (strategies), `shape` the family of its
    error body ("openai" or "ollama"), `cheap` applied to generated dicts, `clean` to every
    generated JSON value; `path` may hold {conversation} / {patched} (the fixtures' ids)."""

    def __init__(self, name, method, path, shape, fields, cheap=None, clean=None):
        self.name, self.method, self.path, self.shape, self.fields = name, method, path, shape, fields
        self.cheap = cheap or (lambda body: body)
        self.clean = clean or (lambda value: value)

    def __repr__(self):
        return f"<{self.method} {self.path}>"


ROUTES = [
    Route("chat_completions", "POST", "/v1/chat/completions", "openai", CHAT, one_token_openai),
    Route("completions", "POST", "/v1/completions", "openai", COMPLETIONS, one_token_openai),
    Route("ollama_chat", "POST", "/api/chat", "ollama", OLLAMA_CHAT, one_token_ollama),
    Route("ollama_generate", "POST", "/api/generate", "ollama", OLLAMA_GENERATE, one_token_ollama),
    Route("ollama_show", "POST", "/api/show", "ollama", OLLAMA_SHOW),
    Route("create_conversation", "POST", "/app/conversations", "openai", NEW_CONVERSATION),
    Route("update_conversation", "PATCH", "/app/conversations/{patched}", "openai", CONVERSATION),
    Route("reply", "POST", "/app/conversations/{conversation}/reply", "openai", REPLY),
    Route("pull", "POST", "/app/models/pull", "openai", PULL, clean=without_slashes),
    Route("put_settings", "PUT", "/app/settings", "openai", APP_SETTINGS),
]
ROUTE_IDS = [r.name for r in ROUTES]


@st.composite
def mangled_json(draw, base):
    """A generated body's JSON text, cut, spliced with random bytes, or otherwise broken."""
    raw = json.dumps(draw(base)).encode()
    at = draw(st.integers(0, len(raw)))
    how = draw(st.sampled_from(["cut", "insert", "replace", "bom", "nested", "twice", "trailing"]))
    junk = draw(st.binary(min_size=1, max_size=8))
    if how == "cut":
        return raw[:at]
    if how == "insert":
        return raw[:at] + junk + raw[at:]
    if how == "replace":
        return raw[:at] + junk + raw[at + len(junk):]
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how == "nested":
        return b"[" * 200 + raw + b"]" * draw(st.integers(0, 200))
    if how == "twice":
        return raw + raw
    return raw + b" " + junk


def json_bodies(route):
    return st.one_of(json_values, fields(route.fields))


def byte_bodies(route):
    return st.one_of(st.binary(max_size=256), mangled_json(fields(route.fields)), mangled_json(json_values))


# --- sending and checking ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_http(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        yield client


@pytest.fixture(scope="module")
def targets(fuzz_http):
    """The conversations the id routes use: one that replies are fuzzed on (one token per
    reply) and one that PATCHes are."""
    ids = {}
    for name in ("conversation", "patched"):
        resp = fuzz_http.post("/app/conversations", json={"title": f"fuzz {name}", "settings": {"max_tokens": 1}})
        assert resp.status_code == 200, resp.text
        ids[name] = resp.json()["id"]
    return ids


@pytest.fixture(scope="module")
def saved_settings(fuzz_http):
    """The app settings before the fuzz, put back (and checked) after it."""
    before = fuzz_http.get("/app/settings")
    assert before.status_code == 200, before.text
    yield before.json()
    restored = fuzz_http.put("/app/settings", json=before.json())
    assert restored.status_code == 200, restored.text
    assert fuzz_http.get("/app/settings").json() == before.json()


def send(client, server, method, url, content=None, headers=None):
    """The response with its whole body read, or a test failure naming what went wrong."""
    try:
        return client.request(method, url, content=content, headers=headers)
    except httpx.TimeoutException:
        pytest.fail(f"{method} {url}: no complete answer within {TIMEOUT}s (body {content!r:.300})")
    except httpx.TransportError as exc:
        alive = server.process.poll() is None
        pytest.fail(
            f"{method} {url}: the connection failed ({exc!r}); server {'alive' if alive else 'DEAD'}; "
            f"body {content!r:.300}; stderr tail:\n{server.stderr()[-2000:]}"
        )


def check_error_body(resp, shape, what):
    assert resp.headers.get("content-type", "").startswith("application/json"), (what, resp.status_code,
                                                                                  resp.headers, resp.text[:300])
    try:
        body = resp.json()
    except ValueError:
        pytest.fail(f"{what}: {resp.status_code} with a body that is not JSON: {resp.text[:300]!r}")
    assert isinstance(body, dict) and "error" in body, (what, resp.status_code, body)
    error = body["error"]
    if shape == "ollama":
        assert isinstance(error, str) and error, f"{what}: not Ollama's error shape: {body}"
    else:
        assert isinstance(error, dict), f"{what}: not OpenAI's error shape: {body}"
        assert isinstance(error.get("message"), str) and error["message"], (what, body)
        assert isinstance(error.get("type"), str) and error["type"], (what, body)


def stream_errors(resp):
    """Error events in a successful SSE or NDJSON body (a failure after the 200 was sent)."""
    kind = resp.headers.get("content-type", "")
    if kind.startswith("text/event-stream"):
        events = [line[len("data: "):] for line in resp.text.splitlines() if line.startswith("data: ")]
    elif kind.startswith("application/x-ndjson"):
        events = [line for line in resp.text.splitlines() if line]
    else:
        return []
    found = []
    for event in events:
        if event == "[DONE]":
            continue
        obj = json.loads(event)
        if "error" in obj or obj.get("type") == "error":
            found.append(event)
    return found


def check(resp, shape, may_succeed, what):
    status = resp.status_code
    if currently_in_test_context():
        note(f"{what} -> {status} {resp.text[:300]!r}")
    assert status < 500, f"{what}: server error {status}: {resp.text[:1000]}"
    if 200 <= status < 300:
        assert may_succeed, f"{what}: {status} for an input that cannot be a valid request: {resp.text[:300]}"
        assert not stream_errors(resp), f"{what}: {status}, then failed mid-stream: {stream_errors(resp)[:3]}"
        return
    assert 400 <= status < 500, f"{what}: unexpected status {status}: {resp.text[:300]}"
    check_error_body(resp, shape, what)


def route_url(route, targets):
    return route.path.format(**targets)


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
@FUZZ
@given(data=st.data())
def test_json_values(route, data, server, fuzz_http, targets, saved_settings):
    value = route.clean(data.draw(json_bodies(route), label="body"))
    if isinstance(value, dict):
        value = route.cheap(value)
    content = json.dumps(value).encode()
    url = route_url(route, targets)
    resp = send(fuzz_http, server, route.method, url, content, JSON_HEADERS)
    # Structs deserialize from JSON arrays too (fields in order), so lists may be valid.
    check(resp, route.shape, isinstance(value, (dict, list)), f"{route.method} {url} {content!r:.300}")


def reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def parsed(content):
    """The JSON value of `content` as a strict parser reads it (UTF-8, nothing after it), or None."""
    try:
        return json.loads(content.decode("utf-8"), parse_constant=reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def leading_json(content):
    """(value, end): the JSON value `content` starts with (whatever follows it), or (None, 0)."""
    text = content.decode("utf-8", "surrogateescape")
    start = len(text) - len(text.lstrip(" \t\r\n"))
    try:
        value, end = json.JSONDecoder(parse_constant=reject_constant).raw_decode(text, start)
    except (ValueError, RecursionError):
        return None, 0
    return value, len(text[:end].encode("utf-8", "surrogateescape"))


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
@FUZZ
@given(data=st.data())
def test_bytes(route, data, server, fuzz_http, targets, saved_settings):
    content = data.draw(byte_bodies(route), label="bytes")
    if route.clean is without_slashes:
        content = re.sub(rb"(?i)\\u002f", b"|", content.replace(b"/", b"|"))
    value, end = leading_json(content)
    if isinstance(value, dict) and route.cheap(copy.deepcopy(value)) != value:
        # It starts with a request that could run long (were what follows it ignored): that
        # part asks for one token instead.
        content = json.dumps(route.cheap(value)).encode() + content[end:]
    url = route_url(route, targets)
    resp = send(fuzz_http, server, route.method, url, content, JSON_HEADERS)
    # Only what parses as one JSON array or object may be accepted.
    check(resp, route.shape, isinstance(parsed(content), (dict, list)), f"{route.method} {url} {content!r:.300}")


VALID = {
    "/v1/chat/completions": {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    "/v1/completions": {"model": DEFAULT_MODEL, "prompt": "hi", "max_tokens": 1},
    "/api/chat": {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False,
                  "options": {"num_predict": 1}},
    "/api/generate": {"model": DEFAULT_MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 1}},
    "/app/conversations": {"title": "fuzz trailing"},
}


@pytest.mark.parametrize("junk", [b" trailing", b"{]", b"\x00", b"}"], ids=["word", "brackets", "nul", "brace"])
@pytest.mark.parametrize("path", list(VALID))
def test_bytes_after_a_valid_body_are_refused(path, junk, server, fuzz_http):
    """A valid body followed by anything but whitespace is not JSON: a 400, like any other."""
    content = json.dumps(VALID[path]).encode() + junk
    resp = send(fuzz_http, server, "POST", path, content, JSON_HEADERS)
    shape = "ollama" if path.startswith("/api/") else "openai"
    check(resp, shape, False, f"POST {path} {content!r}")
    assert resp.status_code == 400, (path, content, resp.status_code, resp.text[:300])


# --- query strings and path segments ----------------------------------------------------------

segment_text = st.text(min_size=1, max_size=24) | st.sampled_from(
    ["99999999999999999999", "-99999999999999999999", "1.5", "1e3", "0x10", " 7", "7 ", "", "..", "%"]
)


def not_numeric(s):
    """A path segment that cannot be a conversation id (so nothing real is touched); ids out of
    the i64 range stay (they are not ids either)."""
    if s in ("", ".", ".."):
        return s + "x"
    try:
        if -(2**63) <= int(s) < 2**63:  # Python's int() is laxer than Rust's: it errs on the safe side
            return s + "x"
    except ValueError:
        pass
    return s


raw_segments = st.one_of(
    segment_text.map(not_numeric).map(lambda s: urllib.parse.quote(s, safe="")),
    st.binary(min_size=1, max_size=8).map(lambda b: urllib.parse.quote(b"x" + b, safe="")),  # invalid UTF-8 too
)


@FUZZ
@given(q=st.text(max_size=40))
def test_conversation_search_query(q, server, fuzz_http):
    url = "/app/conversations?" + urllib.parse.urlencode({"q": q})
    resp = send(fuzz_http, server, "GET", url)
    assert resp.status_code == 200, (url, resp.status_code, resp.text[:300])
    assert isinstance(resp.json(), list), resp.text[:300]


@FUZZ
@given(raw=st.one_of(
    st.binary(max_size=24).map(lambda b: "q=" + urllib.parse.quote(b, safe="")),
    st.text(alphabet="q=&%+ab;fF0[]", max_size=16),
))
def test_conversation_search_raw_query(raw, server, fuzz_http):
    url = "/app/conversations?" + raw
    resp = send(fuzz_http, server, "GET", url)
    check(resp, "openai", True, f"GET {url}")
    if resp.status_code == 200:
        assert isinstance(resp.json(), list), resp.text[:300]


@FUZZ
@given(method=st.sampled_from(["GET", "PATCH", "DELETE"]), segment=raw_segments,
       suffix=st.sampled_from(["", "/reply"]))
def test_non_numeric_conversation_id(method, segment, suffix, server, fuzz_http):
    if suffix:
        method = "POST"
    url = f"/app/conversations/{segment}{suffix}"
    body = b'{"content": "hi"}' if suffix else b'{"title": "fuzz"}'
    resp = send(fuzz_http, server, method, url, body if method != "GET" else None, JSON_HEADERS)
    check(resp, "openai", False, f"{method} {url}")
    assert resp.status_code == 400, (url, resp.status_code, resp.text[:300])
    assert resp.json()["error"].get("param") == "id", resp.text[:300]


@FUZZ
@given(org=raw_segments, name=raw_segments)
def test_cancel_pull_path(org, name, server, fuzz_http):
    url = f"/app/models/pulls/{org}/{name}"
    resp = send(fuzz_http, server, "DELETE", url)
    check(resp, "openai", False, f"DELETE {url}")


@FUZZ
@given(name=raw_segments)
def test_delete_model_path(name, server, fuzz_http):
    # "fuzz-none-" keeps it from naming an installed model.
    url = f"/app/models/fuzz-none-{name}"
    resp = send(fuzz_http, server, "DELETE", url)
    check(resp, "openai", False, f"DELETE {url}")


# --- afterwards -------------------------------------------------------------------------------

PROBE = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Name a color."}],
         "max_tokens": 12, "temperature": 0.8, "seed": 4242}


@pytest.fixture(scope="module", autouse=True)
def probe_before(fuzz_http):
    """A seeded chat, answered before the first fuzz test (autouse) for the last to compare."""
    resp = fuzz_http.post("/v1/chat/completions", json=PROBE)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]["content"]


def test_the_server_still_answers_after_the_fuzz(server, fuzz_http, probe_before):
    assert server.process.poll() is None, server.stderr()[-3000:]
    server.wait_idle(timeout=30)
    resp = fuzz_http.post("/v1/chat/completions", json=PROBE)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"][0]["message"]["content"] == probe_before and probe_before.strip()
    assert body["usage"]["completion_tokens"] > 0
    health = fuzz_http.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
