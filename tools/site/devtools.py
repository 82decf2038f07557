"""A headless chromium driven through the DevTools protocol, with the standard library only.

    with serve(site) as base, Browser(find_chromium(), timeout=30, width=1280, height=2000) as browser:
        browser.tab.call("Page.navigate", url=base + "index.html")
        browser.tab.wait_for("Page.loadEventFired", 30)
        title = browser.tab.evaluate("document.title")

The plumbing of tools/site/browser_check.py (which holds the checks): a local HTTP server for
the built site, launching chromium, a small websocket client (RFC 6455, client half) and a
DevTools session on the page target. CHROMIUM_NAMES is the one list of browser executables
the course looks for (tests/test_course_site.py uses it too).
"""
from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import urlopen

# Debian and Ubuntu's chromium, then Google's builds.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
INSTALL_HINT = "Debian: apt-get install -y chromium"


def find_chromium(explicit: str | None = None) -> str | None:
    """`explicit` (a path or a name) if given, else the first of CHROMIUM_NAMES on the PATH."""
    for name in [explicit] if explicit else CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@contextlib.contextmanager
def serve(site: Path):
    """Serve `site` on 127.0.0.1 (a free port); yields the base URL, ending in '/'."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class WebSocket:
    """The client half of RFC 6455, enough for the DevTools protocol: text frames, masking,
    fragmented messages, ping/pong, close."""

    def __init__(self, url: str, timeout: float):
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET {parts.path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(request.encode())
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("websocket handshake: connection closed")
            response += chunk
        head, self.buffer = response.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket handshake refused: {head[:200]!r}")

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buffer)))
            if not chunk:
                raise ConnectionError("websocket closed by the browser")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        header = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def send(self, text: str) -> None:
        self._send_frame(0x1, text.encode())

    def receive(self) -> str:
        message = b""
        while True:
            first, second = self._read(2)
            opcode, length = first & 0x0F, second & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if second & 0x80 else None
            payload = self._read(length)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x8:
                raise ConnectionError("websocket closed by the browser")
            if opcode == 0x9:
                self._send_frame(0xA, payload)
                continue
            if opcode in (0x0, 0x1, 0x2):
                message += payload
                if first & 0x80:
                    return message.decode(errors="replace")

    def close(self) -> None:
        try:
            self._send_frame(0x8, b"")
        except OSError:
            pass
        self.sock.close()


class Session:
    """A DevTools session on one page target: commands with their replies, and the events
    (Page.*, Runtime.*, Network.*, ...) that arrive meanwhile, collected in `events`."""

    def __init__(self, ws_url: str, timeout: float):
        self.ws = WebSocket(ws_url, timeout)
        self.timeout = timeout
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params):
        self.next_id += 1
        wanted = self.next_id
        self.ws.send(json.dumps({"id": wanted, "method": method, "params": params}))
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            message = json.loads(self.ws.receive())
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)
        raise TimeoutError(f"{method}: no reply in {self.timeout} s")

    def wait_for(self, method: str, seconds: float) -> bool:
        """True once an event `method` has arrived (since `events` was last cleared)."""
        if any(e["method"] == method for e in self.events):
            return True
        deadline = time.monotonic() + seconds
        self.ws.sock.settimeout(0.5)
        try:
            while time.monotonic() < deadline:
                try:
                    message = json.loads(self.ws.receive())
                except socket.timeout:
                    continue
                if "method" in message:
                    self.events.append(message)
                    if message["method"] == method:
                        return True
            return False
        finally:
            self.ws.sock.settimeout(self.timeout)

    def drain(self, seconds: float) -> None:
        """Collect the events of the next `seconds`."""
        self.wait_for("__none__", seconds)

    def navigate(self, url: str, seconds: float = 30) -> bool:
        """Load `url` with a fresh `events` list; False when it did not finish loading in time."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        return self.wait_for("Page.loadEventFired", seconds)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails'].get('text')}: "
                               f"{result['exceptionDetails'].get('exception', {}).get('description', '')}")
        return result["result"].get("value")

    def screenshot(self, path: Path, clip: dict | None = None) -> None:
        """A PNG of the viewport, or of `clip` ({x, y, width, height} in page coordinates)."""
        params = {"format": "png"}
        if clip:
            params.update(clip=dict(clip, scale=1), captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", **params)["data"]))


class Browser:
    """A headless chromium with a throwaway profile; `tab` is a Session on its first page."""

    def __init__(self, chromium: str, timeout: float, width: int, height: int):
        self.profile = tempfile.mkdtemp(prefix="site-check-chromium-")
        self.tab: Session | None = None
        command = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                   "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   "--hide-scrollbars", "--mute-audio", f"--user-data-dir={self.profile}",
                   "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                   f"--window-size={width},{height}", "about:blank"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        try:
            port = self._devtools_port(deadline=time.monotonic() + 30)
            threading.Thread(target=self._drain_stderr, daemon=True).start()
            targets = json.load(urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout))
            page = next(t for t in targets if t.get("type") == "page")
            self.tab = Session(page["webSocketDebuggerUrl"], timeout)
            self.tab.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                          deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.close()
            raise

    def _devtools_port(self, deadline: float) -> int:
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line:
                if self.process.poll() is not None:
                    break
                continue
            self.stderr.append(line)
            match = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if match:
                return int(match.group(1))
        raise RuntimeError("chromium did not start its DevTools endpoint; its output:\n" + "".join(self.stderr[-20:]))

    def _drain_stderr(self):
        for line in self.process.stderr:
            self.stderr.append(line)

    def close(self):
        if self.tab:
            self.tab.ws.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
