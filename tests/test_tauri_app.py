"""The real app (`target/debug/seedbar-app`) under Xvfb: its window driven through WebKit's
WebDriver (WebKitWebDriver, one keep-alive connection), its tray menu docked in `trayer`
and clicked with xdotool. The store holds the real SmolLM2-135M-Instruct.

Screenshots (chat-window.png, tray-menu.png, quick-chat.png) land in $SEEDBAR_SCREENSHOTS
(`make screenshots`: docs/screenshots/), else in target/screenshots/.
"""

import base64
import ctypes
import ctypes.util
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from conftest import BIN, DEFAULT_MODEL, ROOT, default_gguf, wait_for

APP = ROOT / "target" / "debug" / "seedbar-app"
SCREENSHOTS = Path(os.environ.get("SEEDBAR_SCREENSHOTS") or ROOT / "target" / "screenshots")
SCREEN = (1280, 800)
QUESTION = "What is the capital of France? Answer in one sentence."
TOOLS = ["Xvfb", "WebKitWebDriver", "trayer", "xdotool", "xclip", "import", "dbus-daemon"]
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the Xvfb route is Linux-only")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebDriver:
    """A W3C WebDriver client over one keep-alive HTTP connection (the driver's
    documentation warns that clients opening a connection per request see dropped ones)."""

    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        self.session = None

    def call(self, method, path, body=None):
        url = path if self.session is None else f"/session/{self.session}{path}"
        payload = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if payload else {}
        self.conn.request(method, url, body=payload, headers=headers)
        response = self.conn.getresponse()
        data = json.loads(response.read() or b"{}")
        if response.status != 200:
            raise AssertionError(f"WebDriver {method} {url}: {response.status} {data}")
        return data.get("value")

    def start(self, binary, args=()):
        value = self.call("POST", "/session", {"capabilities": {"alwaysMatch": {
            "webkitgtk:browserOptions": {"binary": str(binary), "args": list(args)},
        }}})
        self.session = value["sessionId"]
        return value

    def quit(self):
        if self.session is not None:
            try:
                self.call("DELETE", "")
            except Exception:  # the app may already be gone
                pass
            self.session = None
        self.conn.close()

    def js(self, script, *args):
        return self.call("POST", "/execute/sync", {"script": script, "args": list(args)})

    def js_async(self, script, *args):
        """Runs `script`; it calls `arguments[arguments.length - 1]` with the result."""
        return self.call("POST", "/execute/async", {"script": script, "args": list(args)})

    def find(self, css):
        found = self.call("POST", "/element", {"using": "css selector", "value": css})
        assert isinstance(found, dict) and ELEMENT in found, f"{css}: {found}"
        return found[ELEMENT]

    def on_element(self, css, action, body):
        """`action` on the element `css` finds, found again where the page re-rendered it
        between finding and acting (WebDriver's stale element reference)."""
        for attempt in range(5):
            try:
                return self.call("POST", f"/element/{self.find(css)}/{action}", body)
            except AssertionError as e:
                if "stale element reference" not in str(e) or attempt == 4:
                    raise
                time.sleep(0.2)

    def click(self, css):
        self.on_element(css, "click", {})

    def type(self, css, text):
        self.on_element(css, "value", {"text": text})

    def screenshot(self, path):
        Path(path).write_bytes(base64.b64decode(self.call("GET", "/screenshot")))

    def wait_js(self, script, timeout, message, *args):
        return wait_for(lambda: self.js(script, *args), timeout, interval=0.25, message=message)


class _ClientMessage(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("serial", ctypes.c_ulong), ("send_event", ctypes.c_int),
                ("display", ctypes.c_void_p), ("window", ctypes.c_ulong),
                ("message_type", ctypes.c_ulong), ("format", ctypes.c_int),
                ("data", ctypes.c_long * 5)]


class _XEvent(ctypes.Union):
    _fields_ = [("xclient", _ClientMessage), ("pad", ctypes.c_long * 24)]


def request_close(display, window):
    """What a window manager does when the close button is clicked: a WM_DELETE_WINDOW
    message (Xvfb has no window manager to do it; libX11 through ctypes)."""
    x11 = ctypes.CDLL(ctypes.util.find_library("X11"))
    x11.XOpenDisplay.restype = ctypes.c_void_p
    x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
    x11.XInternAtom.restype = ctypes.c_ulong
    x11.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    x11.XSendEvent.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_long,
                               ctypes.POINTER(_XEvent)]
    x11.XFlush.argtypes = [ctypes.c_void_p]
    x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    dpy = x11.XOpenDisplay(display.encode())
    assert dpy, f"cannot open display {display}"
    try:
        event = _XEvent()
        event.xclient.type = 33  # ClientMessage
        event.xclient.window = window
        event.xclient.message_type = x11.XInternAtom(dpy, b"WM_PROTOCOLS", 0)
        event.xclient.format = 32
        event.xclient.data[0] = x11.XInternAtom(dpy, b"WM_DELETE_WINDOW", 0)
        event.xclient.data[1] = 0  # CurrentTime
        assert x11.XSendEvent(dpy, window, 0, 0, ctypes.byref(event))
        x11.XFlush(dpy)
    finally:
        x11.XCloseDisplay(dpy)


def visible_windows(desktop, name):
    try:
        return desktop.x("xdotool", "search", "--onlyvisible", "--name", f"^{name}$").split()
    except subprocess.CalledProcessError:  # none
        return []


def tid(name):
    return f'[data-testid="{name}"]'


# Loopback requests never go through a proxy from the environment.
LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_status(url):
    try:
        with LOCAL.open(url, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def api(url, method="GET", body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with LOCAL.open(request, timeout=60) as r:
        return json.loads(r.read() or b"null")


class Desktop:
    """Xvfb, a tray host, and the processes started on that display."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs = []
        read, write = os.pipe()
        xvfb = subprocess.Popen(
            ["Xvfb", "-displayfd", str(write), "-screen", "0", f"{SCREEN[0]}x{SCREEN[1]}x24",
             "-nolisten", "tcp"],
            pass_fds=[write], stdout=subprocess.DEVNULL, stderr=open(tmp / "xvfb.log", "w"))
        os.close(write)
        self.procs.append(xvfb)
        with os.fdopen(read) as f:
            self.display = ":" + f.readline().strip()
        self.env = dict(os.environ, DISPLAY=self.display, NO_PROXY="127.0.0.1,localhost",
                        no_proxy="127.0.0.1,localhost")
        # No session bus: the tray falls back to the XEmbed tray that trayer hosts.
        self.env.pop("WAYLAND_DISPLAY", None)
        self.env["DBUS_SESSION_BUS_ADDRESS"] = "disabled:"
        self.spawn("trayer", ["trayer", "--edge", "top", "--align", "right", "--widthtype",
                              "request", "--height", "28", "--tint", "0x303030",
                              "--transparent", "true", "--alpha", "0", "--SetDockType", "true"])

    def spawn(self, name, argv, env=None):
        log = open(self.tmp / f"{name}.log", "w")
        proc = subprocess.Popen(argv, env=env or self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def x(self, *argv, **kwargs):
        return subprocess.run(list(argv), env=self.env, check=True, capture_output=True,
                              text=True, timeout=30, **kwargs).stdout

    def screenshot(self, path):
        self.x("import", "-window", "root", str(path))

    def close(self):
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    missing = [t for t in TOOLS if shutil.which(t) is None]
    assert not missing, f"missing {missing}: run scripts/setup.sh"
    assert APP.exists(), f"{APP} is missing: build with `make app`"
    assert BIN.exists(), f"{BIN} is missing: build with `cargo build -p seedbar-cli`"
    tmp = tmp_path_factory.mktemp("tauri-app")
    home = tmp / "home"
    user = tmp / "user"  # $HOME: the login item (~/.config/autostart) and WebKit's data
    user.mkdir()
    subprocess.run([BIN, "models", "add", default_gguf(), "--name", DEFAULT_MODEL], check=True,
                   capture_output=True, env=dict(os.environ, SEEDBAR_HOME=str(home)), timeout=300)
    desktop = Desktop(tmp)
    port = free_port()
    env = dict(desktop.env, SEEDBAR_HOME=str(home), SEEDBAR_PORT=str(port), HOME=str(user),
               TAURI_WEBVIEW_AUTOMATION="true", RUST_LOG="info")
    env.pop("SEEDBAR_API_KEY", None)
    env.pop("SEEDBAR_MODEL", None)
    driver_port = free_port()
    desktop.spawn("webdriver", ["WebKitWebDriver", f"--port={driver_port}"], env=env)
    driver = WebDriver(driver_port)
    wait_for(lambda: _answers(driver_port), 30, message="WebKitWebDriver to listen")
    base = f"http://127.0.0.1:{port}"
    try:
        driver.start(APP)
        wait_for(lambda: http_status(base + "/health") == 200, 180, message="the app's server")
        yield {"driver": driver, "desktop": desktop, "base": base, "home": home, "tmp": tmp,
               "user": user}
    finally:
        driver.quit()
        desktop.close()
        logs = "".join(f"--- {p.name}\n{p.read_text()[-3000:]}\n" for p in sorted(tmp.glob("*.log")))
        print(logs)


def _answers(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_window_chats_with_the_real_model(app):
    d, base = app["driver"], app["base"]
    # The page got the real address and key from the shell.
    seedbar = d.wait_js("return window.__SEEDBAR__ || null", 60, "window.__SEEDBAR__")
    assert seedbar == {"api": base, "apiKey": None}
    assert d.js("return location.protocol") in ("tauri:", "http:")
    d.wait_js(f"return !!document.querySelector('{tid('conversation-list')}')", 60, "the UI")

    d.click(tid("new-chat"))
    conversation = d.wait_js(
        "const m = /#\\/c\\/(\\d+)$/.exec(location.hash); return m ? Number(m[1]) : null",
        60, "a new conversation")
    # Greedy and short, so the reply is the model's one answer; its seed pinned, as the
    # README's picture shows.
    api(f"{base}/app/conversations/{conversation}", "PATCH",
        {"settings": {"temperature": 0, "max_tokens": 24, "seed": 42}})
    d.js("location.reload()")
    # The conversation itself open again (not a composer of another view), before typing.
    d.wait_js(f"return !!document.querySelector('[data-testid=\"chat-view\"][data-conversation=\"{conversation}\"]')"
              f" && !!document.querySelector('{tid('composer-input')}')", 60, "the conversation again")
    d.type(tid("composer-input"), QUESTION)
    d.click(tid("send"))
    reply = d.wait_js(
        """const els = document.querySelectorAll('[data-testid="message"][data-role="assistant"]');
           const el = els[els.length - 1];
           if (!el || el.getAttribute('data-status') !== 'complete') return null;
           return el.querySelector('[data-testid="message-content"]').textContent;""",
        240, "the reply")
    assert "Paris" in reply, reply
    stored = api(f"{base}/app/conversations/{conversation}")["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[0]["content"] == QUESTION
    squash = lambda s: re.sub(r"[^0-9A-Za-z]+", "", s)  # noqa: E731 (markdown drops symbols)
    assert squash(stored[1]["content"]) == squash(reply)

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    d.screenshot(SCREENSHOTS / "chat-window.png")
    assert (SCREENSHOTS / "chat-window.png").stat().st_size > 10_000


def test_tray_shows_live_status_while_a_chat_streams(app):
    """While a reply streams, the tray's tooltip and menu (as the shell draws them, read over
    the page's IPC) show the model, one running chat and the tokens per second (and the share
    of drafts kept, where speculative decoding drafts)."""
    d, base = app["driver"], app["base"]
    body = json.dumps({"model": DEFAULT_MODEL, "stream": True, "max_tokens": 400, "temperature": 0.8,
                       "messages": [{"role": "user", "content": "Write a long story about a dragon."}]})
    conn = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=60)
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    try:
        response.readline()  # streaming
        status = wait_for(lambda: "tok/s" in (s := shell_status(d))["tooltip"] and s, 20,
                          interval=0.2, message="tokens/s in the tooltip")
        # With speculative decoding drafting, the share of drafts kept follows the speed.
        speed = r"1 chat · \d+ tok/s( · \d+% of drafts kept)?"
        assert re.fullmatch(rf"Seedbar: {DEFAULT_MODEL} · {speed}", status["tooltip"]), status
        assert any(re.fullmatch(speed, line) for line in status["lines"]), status
    finally:
        conn.close()
    wait_for(lambda: "tok/s" not in shell_status(d)["tooltip"], 20, message="the idle tooltip")


def find_tray_icon(desktop):
    """The centre of the docked tray icon (trayer's dock window, at the top right), or None."""
    try:
        windows = desktop.x("xdotool", "search", "--class", "trayer").split()
    except subprocess.CalledProcessError:
        return None
    for window in windows:
        geometry = desktop.x("xdotool", "getwindowgeometry", window)
        pos = re.search(r"Position: (\d+),(\d+)", geometry)
        size = re.search(r"Geometry: (\d+)x(\d+)", geometry)
        x, y, w, h = map(int, (*pos.groups(), *size.groups()))
        if w >= 16 and h >= 16:
            return x + w // 2, y + h // 2
    return None


def tray_icon(desktop):
    return wait_for(lambda: find_tray_icon(desktop), 30, message="the tray icon in trayer")


def shown(desktop):
    """Every visible window's id."""
    try:
        return set(desktop.x("xdotool", "search", "--onlyvisible", "--name", "").split())
    except subprocess.CalledProcessError:  # none
        return set()


def choose(app, label, sub=None):
    """Open the tray menu and pick the item whose label starts with `label`, or the item
    `sub` of that submenu, once the menu's windows show (on a loaded machine it can open
    after a fixed pause). Where an item is comes from the shell's status (`items`: the
    entries the arrow keys walk through, as the menu is drawn now)."""
    desktop = app["desktop"]
    items = settled_items(app["driver"])
    downs = next(i for i, item in enumerate(items, 1) if item["label"].startswith(label))
    keys = ["Down"] * downs
    if sub is not None:
        inner = [name.lstrip("*") for name in items[downs - 1]["items"]]
        keys += ["Right"] + ["Down"] * inner.index(sub)
    x, y = tray_icon(desktop)
    before = shown(desktop)
    desktop.x("xdotool", "mousemove", str(x), str(y), "click", "1")
    wait_for(lambda: shown(desktop) - before, 10, message="the tray menu")
    time.sleep(0.8)
    assert shell_status(app["driver"])["items"] == items, "the menu changed while open"
    for key in keys:  # one at a time: a submenu opens as its own window
        desktop.x("xdotool", "key", key)
        time.sleep(0.15 if key != "Right" else 0.6)
    desktop.x("xdotool", "key", "Return")
    time.sleep(0.8)
    # The menu's windows are gone before the next pick (a submenu's may linger).
    try:
        wait_for(lambda: not (shown(desktop) - before), 3, message="the menu to close")
    except AssertionError:
        desktop.x("xdotool", "key", "Escape", "Escape")
        time.sleep(0.5)


def settled_items(driver):
    """The menu's items once they have stayed the same for 4 s, longer than the tray takes to
    look again: a menu rebuilt while open closes (the tray samples what is loaded every
    second, the library and recent conversations every 3 s)."""
    seen = [None, None]

    def settled():
        items = shell_status(driver)["items"]
        same = items == seen[0] == seen[1]
        seen[:] = [items, seen[0]]
        return same and items

    return wait_for(settled, 30, interval=2.0, message="the tray menu to settle")


SPARE = "Spare-Model"
PANEL = "Seedbar Quick Chat"


def test_tray_menu(app):
    desktop, d, base = app["desktop"], app["driver"], app["base"]
    endpoint = base + "/v1"

    # Copy Endpoint URL puts the OpenAI base URL on the clipboard.
    choose(app, "Copy Endpoint URL")
    clip = wait_for(lambda: desktop.x("xclip", "-o", "-selection", "clipboard").strip() or None,
                    10, message="the clipboard")
    assert clip == endpoint

    # Pause: outside clients get 503, the app's routes still answer; Resume restores.
    assert http_status(endpoint + "/models") == 200
    choose(app, "Pause Server")
    wait_for(lambda: http_status(endpoint + "/models") == 503, 10, message="503 while paused")
    assert http_status(base + "/app/status") == 200
    assert http_status(base + "/health") == 200
    choose(app, "Resume Server")
    wait_for(lambda: http_status(endpoint + "/models") == 200, 10, message="200 after resume")

    # Settings and New Chat move the window to their routes.
    choose(app, "Settings")
    d.wait_js("return location.hash === '#/settings'", 10, "the settings route")
    d.wait_js(f"return !!document.querySelector('{tid('app-settings')}')", 10, "the settings view")
    # New Chat: the window goes to `#/new`, where the UI starts a fresh conversation.
    before = d.js("return location.hash")
    choose(app, "New Chat")
    d.wait_js(
        f"""return location.hash !== {json.dumps(before)}
                && !!document.querySelector('{tid('chat-view')}')
                && !document.querySelector('{tid('message')}')""",
        10, "an empty chat after New Chat")

    # A second model in memory: the menu lists both with their sizes, and Unload takes the
    # second out of memory (the default stays).
    subprocess.run([BIN, "models", "add", default_gguf(), "--name", SPARE], check=True, capture_output=True,
                   env=dict(os.environ, SEEDBAR_HOME=str(app["home"])), timeout=300)
    api(base + "/api/generate", "POST", {"model": SPARE, "prompt": "Hi", "stream": False,
                                          "options": {"num_predict": 2}})
    in_memory = lambda: [line for line in shell_status(d)["lines"] if line.startswith("In memory: ")]  # noqa: E731
    lines = wait_for(lambda: len(in_memory()) == 2 and in_memory(), 10, message="both models in the menu")
    assert lines[0].startswith(f"In memory: {DEFAULT_MODEL} (default) · ") and lines[0].endswith(" MB"), lines
    assert lines[1].startswith(f"In memory: {SPARE} · "), lines
    # The second chat model also brings the Default Model menu (the library is sampled every
    # few seconds): wait for it, so that the menu does not change while it is open.
    wait_for(lambda: any(c["label"] == "Default Model" for c in shell_status(d)["items"]), 15,
             message="the Default Model menu")
    # The menu with both models in memory, cropped from the screen's top right corner.
    settled_items(d)
    x, y = tray_icon(desktop)
    desktop.x("xdotool", "mousemove", str(x), str(y), "click", "1")
    time.sleep(1.0)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    desktop.screenshot(app["tmp"] / "screen-menu.png")
    desktop.x("convert", str(app["tmp"] / "screen-menu.png"), "-crop",
              f"560x400+{SCREEN[0] - 560}+0", "+repage", str(SCREENSHOTS / "tray-menu.png"))
    desktop.x("xdotool", "key", "Escape")
    time.sleep(0.5)
    process = next(p for p in psutil.process_iter(["exe"]) if p.info["exe"] == str(APP.resolve()))
    rss_before = process.memory_info().rss
    choose(app, f"Unload {SPARE}")
    ps = lambda: [m["name"] for m in api(base + "/api/ps")["models"]]  # noqa: E731
    wait_for(lambda: SPARE not in ps(), 10, message=f"{SPARE} unloaded from the menu")
    assert DEFAULT_MODEL in ps()
    # Its memory goes back: at least half its file's size (its weights).
    freed = default_gguf().stat().st_size // 2
    wait_for(lambda: process.memory_info().rss < rss_before - freed, 10,
             message=f"RSS to drop by {freed >> 20} MiB from {rss_before >> 20} MiB")
    wait_for(lambda: len(in_memory()) == 1, 10, message="the menu without the unloaded model")


def test_tray_switches_the_default_model_and_reopens_a_conversation(app):
    """Two chat models installed (since test_tray_menu): the tray's Default Model menu makes
    the other one the default at once and in the settings (so for the next start), with its
    check moving; Recent Conversations opens a conversation in the window."""
    d, base = app["driver"], app["base"]

    def submenu(label):
        return next((c["items"] for c in shell_status(d)["items"] if c["label"] == label), None)

    def ready():
        status = api(base + "/app/status")
        return status["state"] == "ready" and status["model"]

    wait_for(lambda: submenu("Default Model") == [f"*{DEFAULT_MODEL}", SPARE], 15,
             message="the Default Model menu")
    choose(app, "Default Model", SPARE)
    wait_for(lambda: ready() == SPARE, 60, message=f"{SPARE} as the default")
    assert api(base + "/app/settings")["default_model"] == SPARE
    wait_for(lambda: submenu("Default Model") == [DEFAULT_MODEL, f"*{SPARE}"], 15, message="the check to move")
    # Quick chat asks the new default.
    app["desktop"].x("xdotool", "key", "ctrl+shift+space")
    wait_for(lambda: visible_windows(app["desktop"], PANEL), 20, message="the panel")
    main = switch_to(d, "/quick.html")
    try:
        d.wait_js("return document.querySelector('[data-testid=\"quick-input\"]').placeholder"
                  f" === 'Ask {SPARE}…'", 20, "quick chat on the new default")
        d.type(tid("quick-input"), "\ue00c")  # Escape
        wait_for(lambda: not visible_windows(app["desktop"], PANEL), 10, message="Esc to hide it")
    finally:
        d.call("POST", "/window", {"handle": main})
    choose(app, "Default Model", DEFAULT_MODEL)
    wait_for(lambda: ready() == DEFAULT_MODEL, 60, message=f"{DEFAULT_MODEL} as the default again")

    # A conversation whose title is its own among the recent ones.
    recent = api(base + "/app/conversations")[:5]
    titles = [c["title"] for c in recent]
    target = next(c for c in recent if titles.count(c["title"]) == 1 and len(c["title"]) <= 40)
    def shown(entries):
        """Each entry its conversation's title, or the title's start and an ellipsis."""
        return entries is not None and len(entries) == len(titles) and all(
            e == t or (e.endswith("…") and " ".join(t.split()).startswith(e[:-1]))
            for e, t in zip(entries, titles))

    wait_for(lambda: shown(submenu("Recent Conversations")), 15, message="the recent conversations")
    d.js("location.hash = '#/settings'")
    choose(app, "Recent Conversations", target["title"])
    d.wait_js(f"return location.hash === '#/c/{target['id']}'", 10, "the conversation's route")


SHORTCUT = "CommandOrControl+Shift+Space"


def switch_to(driver, path):
    """Point the WebDriver session at the app's webview whose page is `path`; returns the
    handle it was on."""
    current = driver.call("GET", "/window")
    for handle in driver.call("GET", "/window/handles"):
        driver.call("POST", "/window", {"handle": handle})
        if driver.js("return location.pathname").endswith(path):
            return current
    raise AssertionError(f"no webview shows {path}")


class KeyGrab:
    """Another X client holding a global key (as another app's shortcut would), through
    libX11's XGrabKey on the root window."""

    def __init__(self, display, key, modifiers):
        self.x11 = x11 = ctypes.CDLL(ctypes.util.find_library("X11"))
        x11.XOpenDisplay.restype = ctypes.c_void_p
        x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
        x11.XDefaultRootWindow.restype = ctypes.c_ulong
        x11.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
        x11.XStringToKeysym.restype = ctypes.c_ulong
        x11.XStringToKeysym.argtypes = [ctypes.c_char_p]
        x11.XKeysymToKeycode.restype = ctypes.c_ubyte
        x11.XKeysymToKeycode.argtypes = [ctypes.c_void_p, ctypes.c_ulong]
        x11.XGrabKey.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_ulong,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_int]
        x11.XSync.argtypes = [ctypes.c_void_p, ctypes.c_int]
        x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
        self.dpy = x11.XOpenDisplay(display.encode())
        assert self.dpy, f"cannot open display {display}"
        code = x11.XKeysymToKeycode(self.dpy, x11.XStringToKeysym(key.encode()))
        x11.XGrabKey(self.dpy, code, modifiers, x11.XDefaultRootWindow(self.dpy), 0, 1, 1)
        x11.XSync(self.dpy, 0)

    def close(self):
        self.x11.XCloseDisplay(self.dpy)


def test_quick_chat_on_the_global_shortcut(app):
    """Ctrl+Shift+Space (pressed with xdotool) opens the always-on-top panel with its input
    focused; the default model's answer streams; "Open as conversation" saves question and
    answer (with the seed) and shows it in the chat window; Esc and the shortcut hide it. A
    shortcut another app holds is reported, and the Tray's Quick Chat opens the panel too."""
    desktop, d, base = app["desktop"], app["driver"], app["base"]
    quick = wait_for(lambda: (q := shell_status(d)["quick_chat"])["shortcut"] and q, 20,
                     message="the registered shortcut")
    assert quick == {"shortcut": SHORTCUT, "problem": None}, quick
    conversations = {c["id"] for c in api(base + "/app/conversations")}

    desktop.x("xdotool", "key", "ctrl+shift+space")
    panel = wait_for(lambda: visible_windows(desktop, PANEL), 20, message="the panel")
    main = switch_to(d, "/quick.html")
    try:
        d.wait_js("return document.activeElement?.dataset.testid === 'quick-input'", 20, "focus in the input")
        d.wait_js("return document.querySelector('[data-testid=\"quick-input\"]').placeholder"
                  f" === 'Ask {DEFAULT_MODEL}…'", 20, "the default model")
        d.js("""const seen = (window.__seen = []);
                new MutationObserver(() => {
                  const t = document.querySelector('[data-testid="quick-answer-text"]')?.textContent;
                  if (t && seen.at(-1) !== t) seen.push(t);
                }).observe(document.body, {subtree: true, childList: true, characterData: true});""")
        d.type(tid("quick-input"), QUESTION)
        d.wait_js(f"return document.querySelector('{tid('quick-send')}')?.disabled === false", 10,
                  "the Ask button")
        d.click(tid("quick-send"))
        state = d.wait_js(f"""const s = document.querySelector('{tid('quick-answer')}')?.dataset.state;
                              return s && s !== 'streaming' && s;""", 120, "the answer")
        assert state == "complete", d.js("return document.querySelector('.quick').textContent")
        seen = d.js("return window.__seen")
        assert len(seen) >= 2, f"the answer streamed: {seen}"
        assert {c["id"] for c in api(base + "/app/conversations")} == conversations, "nothing saved yet"
        painted(d)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        desktop.screenshot(SCREENSHOTS / "quick-chat.png")

        d.click(tid("quick-open"))
        wait_for(lambda: not visible_windows(desktop, PANEL), 10, message="the panel to hide")
    finally:
        d.call("POST", "/window", {"handle": main})
    saved = [c for c in api(base + "/app/conversations") if c["id"] not in conversations]
    assert [c["title"] for c in saved] == [QUESTION], saved
    stored = api(f"{base}/app/conversations/{saved[0]['id']}")["messages"]
    assert [(m["role"], m["status"]) for m in stored] == [("user", "complete"), ("assistant", "complete")]
    assert stored[0]["content"] == QUESTION and stored[1]["seed"] is not None
    squash = lambda s: re.sub(r"[^0-9A-Za-z]+", "", s)  # noqa: E731 (markdown drops symbols)
    unlist = lambda s: re.sub(r"(?m)^\s*\d+[.)]\s+", "", s)  # noqa: E731 (and list numbers)
    assert squash(unlist(stored[1]["content"])) == squash(seen[-1])
    d.wait_js(f"return location.hash === '#/c/{saved[0]['id']}'", 10, "the conversation in the chat window")
    d.wait_js(f"return document.querySelectorAll('{tid('message')}').length === 2", 20, "its messages")

    # Esc hides the panel (typed into the page: Xvfb has no window manager to move the
    # keyboard focus); the shortcut toggles it.
    desktop.x("xdotool", "key", "ctrl+shift+space")
    assert wait_for(lambda: visible_windows(desktop, PANEL), 10, message="the panel again") == panel
    switch_to(d, "/quick.html")
    try:
        d.wait_js("return document.activeElement?.dataset.testid === 'quick-input'", 10, "focus again")
        d.type(tid("quick-input"), "\ue00c")  # Escape
        wait_for(lambda: not visible_windows(desktop, PANEL), 10, message="Esc to hide it")
    finally:
        d.call("POST", "/window", {"handle": main})
    choose(app, "Quick Chat")
    try:
        wait_for(lambda: visible_windows(desktop, PANEL), 10, message="the tray's Quick Chat")
    except AssertionError:
        # Seen in 2 of about 9 full runs, with the menu open (choose waits for it): the panel
        # did not show. Not understood yet (a hide on blur as the menu closes?); pick the
        # item once more, which must open it.
        desktop.x("xdotool", "key", "Escape")
        choose(app, "Quick Chat")
        wait_for(lambda: visible_windows(desktop, PANEL), 10, message="the tray's Quick Chat")
    desktop.x("xdotool", "key", "ctrl+shift+space")
    wait_for(lambda: not visible_windows(desktop, PANEL), 10, message="the shortcut to hide it")

    # A shortcut another app holds: the shell says so (Settings shows it) and keeps none.
    settings = api(base + "/app/settings")
    grab = KeyGrab(desktop.display, "F9", 8)  # Mod1 (Alt)
    try:
        api(base + "/app/settings", "PUT", {**settings, "quick_chat_shortcut": "Alt+F9"})
        quick = wait_for(lambda: (q := shell_status(d)["quick_chat"])["shortcut"] == "Alt+F9" and q,
                         10, message="the refused shortcut")
        assert quick["problem"] == "Alt+F9 is in use by another app; choose another shortcut in Settings"
        d.js("location.hash = '#/settings'")
        shown = d.wait_js(f"return document.querySelector('{tid('settings-quick-shortcut-problem')}')"
                          "?.textContent", 10, "the problem in Settings")
        assert shown == quick["problem"]
    finally:
        grab.close()
        api(base + "/app/settings", "PUT", settings)
        # The next tests share the window: back to the conversation it showed.
        d.js(f"location.hash = '#/c/{saved[0]['id']}'")
        d.wait_js(f"return !!document.querySelector('{tid('chat-view')}')", 10, "the chat view back")
    wait_for(lambda: shell_status(d)["quick_chat"] == {"shortcut": SHORTCUT, "problem": None}, 10,
             message="the default shortcut back")


def test_quick_chat_answers_while_paused_and_hides_on_blur(app):
    """Paused (as the tray's Pause does), outside clients get 503 but the panel, the app's
    own request, still answers, and says that Seedbar is paused for other apps. Moving the
    keyboard focus to another window (what a click elsewhere does) hides the panel."""
    desktop, d, base = app["desktop"], app["driver"], app["base"]
    body = {"model": DEFAULT_MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hi"}]}
    assert invoke(d, "set_server_paused", {"paused": True})["ok"]["paused"] is True
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            api(base + "/v1/chat/completions", "POST", body)
        assert refused.value.code == 503
        desktop.x("xdotool", "key", "ctrl+shift+space")
        panel = wait_for(lambda: visible_windows(desktop, PANEL), 20, message="the panel")
        main = switch_to(d, "/quick.html")
        try:
            note = d.wait_js(f"return document.querySelector('{tid('quick-paused')}')?.textContent",
                             10, "the paused note")
            assert note == "Seedbar is paused for other apps; quick chat still answers."
            d.type(tid("quick-input"), QUESTION + "\ue007")  # Enter asks
            state = d.wait_js(f"""const s = document.querySelector('{tid('quick-answer')}')?.dataset.state;
                                  return s && s !== 'streaming' && s;""", 120, "the answer")
            assert state == "complete", d.js("return document.querySelector('.quick').textContent")
            assert d.js(f"return document.querySelector('{tid('quick-answer-text')}').textContent")
        finally:
            d.call("POST", "/window", {"handle": main})
    finally:
        invoke(d, "set_server_paused", {"paused": False})
    assert http_status(base + "/v1/models") == 200

    # Blur: with the keyboard focus in the panel (xdotool gives it, as a window manager does
    # when a window is shown; Xvfb has none), focus moved to the chat window hides it.
    desktop.x("xdotool", "windowfocus", "--sync", panel[0])
    chat = visible_windows(desktop, "Seedbar")
    assert len(chat) == 1, chat
    desktop.x("xdotool", "windowfocus", "--sync", chat[0])
    wait_for(lambda: not visible_windows(desktop, PANEL), 10, message="the panel to hide on blur")
    # The shortcut shows it again. Focused, the shortcut hides it and it stays hidden: the
    # key's grab takes the focus for a moment, which must not count as a blur that the
    # toggle then undoes (so a press within 250 ms of a blur hides; this one comes later).
    time.sleep(0.5)
    desktop.x("xdotool", "key", "ctrl+shift+space")
    assert wait_for(lambda: visible_windows(desktop, PANEL), 10, message="the panel again") == panel
    desktop.x("xdotool", "windowfocus", "--sync", panel[0])
    desktop.x("xdotool", "key", "ctrl+shift+space")
    wait_for(lambda: not visible_windows(desktop, PANEL), 10, message="the shortcut to hide it")
    time.sleep(1)
    assert not visible_windows(desktop, PANEL), "the panel came back after the shortcut hid it"


def test_closing_the_window_hides_it(app):
    desktop, d, base = app["desktop"], app["driver"], app["base"]
    windows = visible_windows(desktop, "Seedbar")
    assert len(windows) == 1, windows
    request_close(desktop.display, int(windows[0]))
    wait_for(lambda: not visible_windows(desktop, "Seedbar"), 10, message="the window to hide")
    # The app lives on: the API answers and the page is still there.
    assert http_status(base + "/v1/models") == 200
    choose(app, "Open Chat")
    wait_for(lambda: visible_windows(desktop, "Seedbar"), 10, message="Open Chat to show it")
    assert visible_windows(desktop, "Seedbar") == windows, "the same window, not a new one"
    assert d.js("return !!document.querySelector('[data-testid=\"chat-view\"]')")


def test_settings_apply_live(app):
    """"Launch at login" from the settings (PUT /app/settings, as the Settings view does)
    turns the login item on and off while the app runs (on Linux: an XDG autostart entry)."""
    base = app["base"]
    entry = app["user"] / ".config" / "autostart" / "Seedbar.desktop"
    settings = api(base + "/app/settings")
    assert settings["launch_at_login"] is False
    assert not entry.exists()
    api(base + "/app/settings", "PUT", {**settings, "launch_at_login": True})
    # The entry exists as soon as it is created, before its lines are written.
    exec_line = wait_for(lambda: entry.exists() and next(
        (line for line in entry.read_text().splitlines() if line.startswith("Exec=")), None),
        10, message="the autostart entry")
    assert exec_line.endswith("seedbar-app --hidden"), exec_line
    api(base + "/app/settings", "PUT", {**settings, "launch_at_login": False})
    wait_for(lambda: not entry.exists(), 10, message="the autostart entry to go")


def test_quit_stops_the_server(app):
    """Quit during a stream stops the server gracefully: the stream finishes or ends with an
    error event (never cut off mid-way), then the port closes."""
    desktop, base = app["desktop"], app["base"]
    # Long enough to be running still when the tray's Quit is picked (400 tokens once ran out
    # first on a faster build, and the menu changed under the keys).
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 3000, "stream": True, "logit_bias": {"0": -100, "2": -100}}
    request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    lines, started = [], threading.Event()

    def read():
        try:
            with LOCAL.open(request, timeout=60) as stream:
                for raw in stream:
                    lines.append(raw.decode().strip())
                    started.set()
        except OSError as e:  # a connection cut off: what the assertion below rejects
            lines.append(f"cut off: {e!r}")
        finally:
            started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert started.wait(60) and lines[0].startswith("data: {"), lines[:3]
    assert "data: [DONE]" not in lines, "the stream ended before Quit"
    # Once the tray counts the chat its menu keeps its entries (only their labels change, in
    # place), so the open menu stays open for the keys.
    # ("… tok/s", and "· N% of drafts kept" after it when speculation drafted.)
    wait_for(lambda: "tok/s" in shell_status(app["driver"])["tooltip"], 20,
             interval=0.2, message="the running chat in the tray")
    choose(app, "Quit Seedbar")

    def gone():
        try:
            socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=1).close()
            return False
        except OSError:
            return True
    wait_for(gone, 20, message="the server to stop after Quit")
    reader.join(10)
    assert not reader.is_alive(), "the stream was left hanging"
    events = [line for line in lines if line]
    assert events[-1] == "data: [DONE]" or '"error"' in events[-1], events[-3:]


def invoke(driver, command, args=None):
    """A Tauri command through the page's real IPC: {"ok": value} or {"error": message}."""
    return driver.js_async(
        """const done = arguments[arguments.length - 1];
           window.__TAURI_INTERNALS__.invoke(arguments[0], arguments[1])
             .then((ok) => done({ok}), (error) => done({error: String(error)}));""",
        command, args or {})


def start_with_driver(desktop, env):
    driver_port = free_port()
    desktop.spawn("webdriver", ["WebKitWebDriver", f"--port={driver_port}"],
                  env=dict(env, TAURI_WEBVIEW_AUTOMATION="true"))
    wait_for(lambda: _answers(driver_port), 30, message="WebKitWebDriver to listen")
    driver = WebDriver(driver_port)
    driver.start(APP)
    driver.wait_js("return !!window.__TAURI_INTERNALS__", 60, "the Tauri page")
    return driver


def painted(driver):
    """Wait for two frames to be painted, so a screenshot shows what the checks saw."""
    driver.js_async("const done = arguments[0]; requestAnimationFrame(() => requestAnimationFrame(() => done(true)));")
    time.sleep(0.5)


def shell_status(driver):
    return invoke(driver, "shell_status")["ok"]


def test_first_start_offline_serves_says_why_and_an_import_fixes_it(tmp_path):
    """A fresh home, no network: the server and the `/app` API answer at once, the first
    download fails, and the window says so in a banner with the fixes (the status dot red);
    a chat request gets a 503 saying why. Importing a GGUF file from the library's path
    field fixes it: the banner goes, the model answers."""
    desktop = Desktop(tmp_path)
    closed = free_port()  # nothing listens there: the hub is unreachable
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(desktop.env, SEEDBAR_HOME=str(tmp_path / "empty-home"), HOME=str(tmp_path),
               SEEDBAR_PORT=str(port), HF_ENDPOINT=f"http://127.0.0.1:{closed}")
    driver = None
    try:
        driver = start_with_driver(desktop, env)
        status = wait_for(lambda: (s := shell_status(driver))["state"] == "error" and s,
                          60, message="the failed download")
        assert status["status"].startswith("Cannot download SmolLM2-135M-Instruct: "), status
        assert "seedbar pull" in status["hint"] and "Import" in status["hint"]
        assert status["endpoint"] == base + "/v1"  # the server answers without a model

        app_status = api(base + "/app/status")
        assert app_status["state"] == "error" and app_status["model"] == "SmolLM2-135M-Instruct"
        assert app_status["problem"].startswith("Cannot download SmolLM2-135M-Instruct: ")
        assert app_status["actions"] == ["retry_download", "import"], app_status
        assert api(base + "/app/conversations") == []
        try:
            api(base + "/v1/chat/completions", "POST", {"model": DEFAULT_MODEL, "messages": [
                {"role": "user", "content": "Hi"}]})
            raise AssertionError("a chat without a model was answered")
        except urllib.error.HTTPError as e:
            assert e.code == 503
            assert "Cannot download" in json.loads(e.read())["error"]["message"]

        # The window: no dead end, a banner with the problem and the fixes.
        banner = driver.wait_js(
            f"""const b = document.querySelector('{tid('status-banner')}');
                return b && b.dataset.state === 'error' && b.textContent;""", 30, "the banner")
        assert "Cannot download SmolLM2-135M-Instruct" in banner and "seedbar pull" in banner, banner
        assert driver.js(f"return !!document.querySelector('{tid('status-retry')}')")
        assert driver.js(f"return !!document.querySelector('{tid('status-import')}')")
        assert driver.js(f"return document.querySelector('{tid('status-dot')}').dataset.state") == "error"
        assert driver.js(f"return !!document.querySelector('{tid('conversations-empty')}')")
        painted(driver)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        driver.screenshot(SCREENSHOTS / "first-start-offline.png")

        # Quick chat says the same, and offers the import.
        desktop.x("xdotool", "key", "ctrl+shift+space")
        wait_for(lambda: visible_windows(desktop, PANEL), 20, message="the panel")
        main = switch_to(driver, "/quick.html")
        try:
            problem = driver.wait_js(
                f"""const p = document.querySelector('{tid('quick-not-ready')}');
                    return p && p.dataset.state === 'error' && p.textContent;""", 20, "the panel's problem")
            assert "Cannot download SmolLM2-135M-Instruct" in problem and "seedbar pull" in problem, problem
            assert driver.js(f"return document.querySelector('{tid('quick-send')}').disabled")
            # The library, in the chat window. (Clicked from a script: a WebDriver click
            # waits on the panel, which the click hides at once.)
            driver.js(f"document.querySelector('{tid('quick-import')}').click()")
            wait_for(lambda: not visible_windows(desktop, PANEL), 10, message="the panel to hide")
        finally:
            driver.call("POST", "/window", {"handle": main})
        driver.wait_js("return location.hash === '#/models'", 10, "the library")

        # The fix: a GGUF file on disk, imported from the library's path field.
        copy = tmp_path / "disk" / "SmolLM2-copy.gguf"
        copy.parent.mkdir()
        shutil.copyfile(default_gguf(), copy)
        driver.wait_js(f"return !!document.querySelector('{tid('import-path')}')", 10, "the import field")
        assert driver.js(f"return !!document.querySelector('{tid('import-file')}')"), "the native picker button"
        driver.type(tid("import-path"), str(copy))
        driver.click(tid("import-submit"))
        driver.wait_js(f"return !document.querySelector('{tid('status-banner')}')", 60, "the banner to go")
        assert driver.js(f"return document.querySelector('{tid('status-dot')}').dataset.state") == "ready"
        assert "SmolLM2-copy" in [m["id"] for m in api(base + "/v1/models")["data"]]
        answer = api(base + "/v1/chat/completions", "POST", {
            "model": "SmolLM2-copy", "temperature": 0, "max_tokens": 12,
            "messages": [{"role": "user", "content": QUESTION}]})
        assert "Paris" in answer["choices"][0]["message"]["content"], answer
        assert shell_status(driver)["state"] == "serving"
    finally:
        if driver:
            driver.quit()
        desktop.close()


class FakeHub:
    """The two Hugging Face hub routes a pull uses, for one repository held in `files`,
    served slowly enough that the download shows progress."""

    def __init__(self, repo, files, seconds=3.0):
        import http.server
        import threading

        hub = self
        self.requests = []
        total = sum(len(b) for b in files.values())

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                path = self.path.split("?")[0]
                hub.requests.append(path)
                if path == f"/api/models/{repo}/revision/main":
                    body = json.dumps({"sha": "0" * 40, "siblings": [
                        {"rfilename": name, "size": len(data)} for name, data in files.items()]})
                    return self.reply(body.encode(), "application/json")
                prefix = f"/{repo}/resolve/{'0' * 40}/"
                if path.startswith(prefix) and path[len(prefix):] in files:
                    return self.reply(files[path[len(prefix):]], "application/octet-stream",
                                      pace=seconds / max(total, 1))
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def reply(self, body, kind, pace=0.0):
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                for i in range(0, len(body), 65536):
                    self.wfile.write(body[i:i + 65536])
                    self.wfile.flush()
                    time.sleep(pace * min(65536, len(body) - i))

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_first_start_downloads_the_default_model(tmp_path):
    """An empty store: the app pulls the default model (a small random-weight llama served
    by a stand-in hub here) as a library download, the tray shows "Downloading N%" and lists
    the download, then it serves the model."""
    from checkpoints import write_checkpoint

    model_dir = write_checkpoint(tmp_path / "checkpoint", "llama")
    files = {p.name: p.read_bytes() for p in sorted(model_dir.iterdir()) if p.is_file()}
    hub = FakeHub("HuggingFaceTB/SmolLM2-135M-Instruct", files)
    desktop = Desktop(tmp_path)
    port = free_port()
    env = dict(desktop.env, SEEDBAR_HOME=str(tmp_path / "home"), HOME=str(tmp_path),
               SEEDBAR_PORT=str(port), HF_ENDPOINT=hub.url)
    driver = None
    try:
        driver = start_with_driver(desktop, env)
        seen, lines = [], set()

        def serving():
            status = shell_status(driver)
            lines.update(status["lines"])
            if not seen or seen[-1] != status["status"]:
                seen.append(status["status"])
            assert status["state"] not in ("error", "download-failed"), status
            return status["state"] == "serving" and status
        wait_for(serving, 120, interval=0.05, message="the download and the model load")
        downloading = [s for s in seen if re.fullmatch(r"Downloading SmolLM2-135M-Instruct \d+%", s)]
        assert len(downloading) >= 2, seen
        percents = [int(s.split()[-1][:-1]) for s in downloading]
        assert percents == sorted(percents) and percents[-1] <= 100, seen
        # The menu lists the download (as it lists those started from the Model Library).
        assert any(re.fullmatch(r"Downloading HuggingFaceTB/SmolLM2-135M-Instruct \d+%", line)
                   for line in lines), lines
        served = api(f"http://127.0.0.1:{port}/v1/models")["data"]
        assert [m["id"] for m in served] == ["HuggingFaceTB--SmolLM2-135M-Instruct"]
        assert any(p.endswith("/config.json") for p in hub.requests)
    finally:
        if driver:
            driver.quit()
        desktop.close()
        hub.close()


def recommended_gguf(offer):
    """The catalogue's GGUF format to serve from the stand-in hub: the recommended model's,
    else one of its size class (the recommendation itself is MLX, which needs real weights)."""
    entries = [(m, f) for m in offer["models"] for f in m["formats"]]
    [(model, _)] = [(m, f) for m, f in entries if f["recommended"]]
    gguf = [(m, f) for m, f in entries if f["format"].startswith("gguf") and f["fits"]]
    return next(((m, f) for m, f in gguf if m["name"] == model["name"]),
                next((m, f) for m, f in gguf if m["size_class"] == model["size_class"]))


def test_the_welcome_in_the_window_pulls_a_model_that_answers_and_offline_imports(tmp_path):
    """The first run's welcome in the real window: offline, it says the hub cannot be reached
    and importing a file from it makes that file the default model; online (a stand-in hub
    serving the catalogue's GGUF entry for this machine with the default model's bytes), a
    download from it shows progress, becomes the default model, and that model answers."""
    desktop = Desktop(tmp_path)
    driver = None
    hub = None
    try:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = dict(desktop.env, SEEDBAR_HOME=str(store_with_default_model(tmp_path / "offline")),
                   HOME=str(tmp_path), SEEDBAR_PORT=str(port), HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
        driver = start_with_driver(desktop, env)
        driver.wait_js(f"return !!document.querySelector('{tid('welcome-recommended')}')", 60, "the welcome")
        machine = driver.js(f"return document.querySelector('{tid('welcome-machine')}').textContent")
        assert re.fullmatch(r"\d+(\.\d)? GB · CPU", machine.strip()), machine
        offer = api(base + "/app/catalogue")
        driver.click(f"{tid('welcome-recommended')} {tid('welcome-download')}")
        error = driver.wait_js(f"return document.querySelector('{tid('welcome-error')}')?.textContent", 60,
                               "the offline message")
        assert "Can't reach the model hub" in error, error
        copy = tmp_path / "disk" / "Imported-Model.gguf"
        copy.parent.mkdir()
        shutil.copyfile(default_gguf(), copy)
        driver.type(f"{tid('welcome')} {tid('import-path')}", str(copy))
        driver.click(f"{tid('welcome')} {tid('import-submit')}")
        wait_for(lambda: api(base + "/app/settings")["default_model"] == "Imported-Model", 60,
                 message="the imported model as the default")
        wait_for(lambda: api(base + "/app/status")["model"] == "Imported-Model"
                 and api(base + "/app/status")["state"] == "ready", 60, message="the imported model ready")
        driver.quit()
        driver = None
        desktop.close()

        model, pick = recommended_gguf(offer)
        repo, file = pick["pull"].split(":")
        hub = FakeHub(repo, {file: default_gguf().read_bytes()})
        desktop = Desktop(tmp_path)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = dict(desktop.env, SEEDBAR_HOME=str(store_with_default_model(tmp_path / "online")),
                   HOME=str(tmp_path), SEEDBAR_PORT=str(port), HF_ENDPOINT=hub.url)
        driver = start_with_driver(desktop, env)
        driver.wait_js(f"return !!document.querySelector('{tid('welcome-recommended')}')", 60, "the welcome")
        listed = driver.js(f"return [...document.querySelectorAll('{tid('welcome-download')}')].map(b => b.dataset.pull)")
        assert pick["pull"] in listed and len(listed) == sum(len(m["formats"]) for m in offer["models"]), listed
        driver.click(f"{tid('welcome-download')}[data-pull=\"{pick['pull']}\"]")
        driver.wait_js(f"return !!document.querySelector('{tid('welcome')} {tid('pull-progress')}')", 30,
                       "the download's progress")
        done = driver.wait_js(f"return document.querySelector('{tid('welcome-done')}')?.textContent", 120,
                              "the download to end")
        assert done.strip() == f"{model['name']} is your default model now.", done
        wait_for(lambda: (s := api(base + "/app/status"))["state"] == "ready" and s["model"] == pick["model_name"],
                 60, message="the pulled model ready")
        # The model answers in the window.
        driver.type(tid("composer-input"), QUESTION)
        driver.click(tid("send"))
        reply = driver.wait_js(
            """const els = document.querySelectorAll('[data-testid="message"][data-role="assistant"]');
               const el = els[els.length - 1];
               return el && el.getAttribute('data-status') === 'complete'
                   && el.querySelector('[data-testid="message-content"]').textContent;""", 120, "the reply")
        assert reply.strip(), reply
        conversation = api(base + "/app/conversations")[0]
        assert conversation["settings"]["model"] in ("", pick["model_name"])
        stored = api(base + f"/app/conversations/{conversation['id']}")["messages"][-1]
        assert stored["sampling"]["model"] == pick["model_name"]
    finally:
        if driver:
            driver.quit()
        desktop.close()
        if hub:
            hub.close()


def store_with_default_model(home):
    subprocess.run([BIN, "models", "add", default_gguf(), "--name", DEFAULT_MODEL], check=True,
                   capture_output=True, env=dict(os.environ, SEEDBAR_HOME=str(home)), timeout=300)
    return home


def test_second_launch_shows_the_running_app(tmp_path):
    """With a session bus (single-instance lock), a second launch hands over to the first,
    which shows its window (started with --hidden, as the login item does), and exits."""
    bus = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--nopidfile",
                            "--print-address=1"], stdout=subprocess.PIPE, text=True)
    desktop = None
    try:
        address = bus.stdout.readline().strip()
        assert address, "dbus-daemon printed no address"
        desktop = Desktop(tmp_path)
        env = dict(desktop.env, SEEDBAR_HOME=str(store_with_default_model(tmp_path / "home")),
                   SEEDBAR_PORT=str(free_port()), HOME=str(tmp_path),
                   DBUS_SESSION_BUS_ADDRESS=address)
        first = desktop.spawn("first", [str(APP), "--hidden"], env=env)
        wait_for(lambda: "Seedbar serving" in (tmp_path / "first.log").read_text(), 120,
                 message="the first instance to serve")
        time.sleep(1)
        assert not visible_windows(desktop, "Seedbar"), "--hidden opens no window"
        second = subprocess.run([str(APP)], env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        assert "Seedbar serving" not in second.stdout
        wait_for(lambda: visible_windows(desktop, "Seedbar"), 20,
                 message="the first instance's window")
        assert first.poll() is None, "the first instance keeps running"
    finally:
        if desktop:
            desktop.close()
        bus.terminate()
        bus.wait(10)


def test_the_icon_the_minimized_start_and_the_default_model_survive_a_restart(tmp_path):
    """Settings that shape the start: the menu-bar icon hidden (and back), the window closed
    at start, and the default model chosen, all kept across a restart."""
    home = store_with_default_model(tmp_path / "home")
    subprocess.run([BIN, "models", "add", default_gguf(), "--name", SPARE], check=True,
                   capture_output=True, env=dict(os.environ, SEEDBAR_HOME=str(home)), timeout=300)
    desktop = Desktop(tmp_path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(desktop.env, SEEDBAR_HOME=str(home), SEEDBAR_PORT=str(port), HOME=str(tmp_path))
    try:
        first = desktop.spawn("first", [str(APP)], env=env)
        wait_for(lambda: f"Seedbar serving {DEFAULT_MODEL}" in (tmp_path / "first.log").read_text(), 120,
                 message="the app to serve")
        tray_icon(desktop)
        wait_for(lambda: visible_windows(desktop, "Seedbar"), 20, message="the window at start")
        settings = api(base + "/app/settings")
        api(base + "/app/settings", "PUT", {**settings, "show_menu_bar_icon": False, "start_minimized": True,
                                            "default_model": SPARE})
        wait_for(lambda: find_tray_icon(desktop) is None, 10, message="the icon to go")
        first.terminate()
        assert first.wait(20) == 0

        second = desktop.spawn("second", [str(APP)], env=env)
        wait_for(lambda: f"Seedbar serving {SPARE}" in (tmp_path / "second.log").read_text(), 120,
                 message="the app to serve the chosen default")
        time.sleep(2)
        assert find_tray_icon(desktop) is None, "the icon stays hidden"
        assert not visible_windows(desktop, "Seedbar"), "the window stays closed"
        settings = api(base + "/app/settings")
        api(base + "/app/settings", "PUT", {**settings, "show_menu_bar_icon": True})
        tray_icon(desktop)
        second.terminate()
        assert second.wait(20) == 0
    finally:
        desktop.close()


def test_sigterm_quits_cleanly(tmp_path):
    """Ctrl-C / SIGTERM end the app like Quit: the server stops, the exit code is 0."""
    home = store_with_default_model(tmp_path / "home")
    desktop = Desktop(tmp_path)
    port = free_port()
    try:
        app = desktop.spawn("app", [str(APP)], env=dict(
            desktop.env, SEEDBAR_HOME=str(home), SEEDBAR_PORT=str(port), HOME=str(tmp_path)))
        wait_for(lambda: "Seedbar serving" in (tmp_path / "app.log").read_text(), 120,
                 message="the app to serve")
        assert http_status(f"http://127.0.0.1:{port}/v1/models") == 200
        app.terminate()
        assert app.wait(20) == 0
        assert not _answers(port)
    finally:
        desktop.close()


def test_a_busy_port_falls_back_to_a_free_one(tmp_path):
    """Another program holds the configured port: the app serves on a free port and says which
    (the endpoint it prints is the one Copy Endpoint URL and /app/status give)."""
    home = store_with_default_model(tmp_path / "home")
    desktop = Desktop(tmp_path)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    busy = holder.getsockname()[1]
    try:
        desktop.spawn("app", [str(APP), "--hidden"], env=dict(
            desktop.env, SEEDBAR_HOME=str(home), SEEDBAR_PORT=str(busy), HOME=str(tmp_path)))
        log = tmp_path / "app.log"
        line = wait_for(lambda: re.search(r"Seedbar serving \S+ at http://127\.0\.0\.1:(\d+)/v1", log.read_text()),
                        120, message="the app to serve")
        port = int(line.group(1))
        assert port != busy
        assert f"port {busy} is in use" in log.read_text()
        assert http_status(f"http://127.0.0.1:{port}/v1/models") == 200
        status = json.loads(LOCAL.open(f"http://127.0.0.1:{port}/app/status", timeout=10).read())
        assert str(port) in json.dumps(status), status
    finally:
        desktop.close()
        holder.close()
