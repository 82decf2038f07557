#!/usr/bin/env python3
"""Check the built course site the way a reader meets it: in a real (headless) browser.

    python3 tools/site/browser_check.py [--site build/site] [--out build/site-check]

Needs only the Python standard library and Debian's chromium (`apt-get install -y chromium`).
It builds nothing: build the site first (`./course site`). It serves the site on 127.0.0.1 (a
free port), drives chromium through the DevTools protocol (a small websocket client below),
and fails, with a list, on:

  static, over every built HTML file
    - an internal href/src that does not resolve to a file, or a #fragment with no such id
    - leftover TeX (class="arithmatex"), or a lesson page without its benchmark figure (an
      <img> of bench/NN-slug.svg, which must exist, be non-empty and parse as SVG)
    - CUDA code blocks without highlighting spans; no palette (dark mode) toggle; the copy
      button feature off; no prev/next footer; a search index that lacks a lesson's title
  in the browser, for every page
    - console errors, uncaught exceptions, failed or 4xx/5xx requests, any request that
      leaves 127.0.0.1 (the site must work offline: no CDN, no web font)
    - an <img> that did not load; `\\(`, `\\[`, `$$` in the text outside code; `--8<--` outside
      inline code (in the prose, or as a line of a code block)
    - a code block without its copy button
  and once: typing a lesson's title into the search box finds that lesson; the palette toggle
  switches to the dark scheme.

Screenshots (1280x2000): OUT/home.png, OUT/lesson-00.png, OUT/lesson-00-dark.png.
Exit status 0 when everything passed, 1 on any failure, 2 when it could not run at all.
"""
from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import os
import posixpath
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit
from urllib.request import urlopen

ROOT = Path(__file__).resolve().parents[2]
LESSON = re.compile(r"^(\d\d-[a-z0-9-]+)(?:/index\.html|\.html)$")
WIDTH, HEIGHT = 1280, 2000


# ====================================================================== static checks
class PageParser(HTMLParser):
    """Collects links, images, ids and a few markers of one built page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.refs: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.ids: set[str] = set()
        self.images: list[str] = []
        self.h1: list[str] = []
        self._in_h1 = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        for key in ("href", "src"):
            if attrs.get(key) is not None and tag in ("a", "img", "link", "script", "source", "iframe"):
                self.refs.append((tag, key, attrs[key]))
        if tag == "img" and attrs.get("src"):
            self.images.append(attrs["src"])
        if tag == "h1":
            self._in_h1 = True
            self.h1.append("")

    def handle_endtag(self, tag):
        if tag == "h1":
            self._in_h1 = False

    def handle_data(self, data):
        if self._in_h1:
            self.h1[-1] += data


def clean_title(text: str) -> str:
    return " ".join(text.replace("¶", "").split())


def internal_target(site: Path, page: str, value: str) -> tuple[str, str] | None:
    """(path relative to the site, fragment) for a link inside the site; None for others."""
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or value.startswith(("mailto:", "data:", "javascript:")):
        return None
    path = unquote(parts.path)
    if not path:
        return page, parts.fragment  # "#frag" on this page
    joined = path.lstrip("/") if path.startswith("/") else posixpath.join(posixpath.dirname(page), path)
    normal = posixpath.normpath(joined)
    if normal.startswith(".."):
        return "../", parts.fragment  # escapes the site: reported as broken
    if normal == ".":
        normal = ""
    if path.endswith("/") or (site / normal).is_dir():
        normal = posixpath.join(normal, "index.html") if normal else "index.html"
    return normal, parts.fragment


def static_checks(site: Path) -> tuple[list[str], list[str], dict[str, PageParser]]:
    failures: list[str] = []
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    parsed: dict[str, PageParser] = {}
    texts: dict[str, str] = {}
    for page in pages:
        text = (site / page).read_text(errors="replace")
        parser = PageParser()
        parser.feed(text)
        parsed[page], texts[page] = parser, text

    for page in pages:
        parser, text = parsed[page], texts[page]
        for tag, attribute, value in parser.refs:
            target = internal_target(site, page, value)
            if target is None:
                continue
            path, fragment = target
            if path == "../" or not (site / path).is_file():
                failures.append(f"{page}: broken link <{tag} {attribute}=\"{value}\"> (no file {path})")
            elif fragment and path.endswith(".html") and path in parsed and unquote(fragment) not in parsed[path].ids:
                failures.append(f"{page}: <{tag} {attribute}=\"{value}\"> points at #{fragment}, which {path} lacks")
        if 'class="arithmatex"' in text:
            failures.append(f"{page}: unrendered math (class=\"arithmatex\" left in the HTML; is site/hooks/math.py on?)")
        if page == "404.html":
            continue
        if 'data-md-component="palette"' not in text or text.count('name="__palette"') < 2:
            failures.append(f"{page}: no palette toggle (dark mode): mkdocs.yml theme.palette needs two schemes with toggles")
        config = re.search(r'<script id="__config" type="application/json">(.*?)</script>', text, re.DOTALL)
        features = json.loads(config.group(1)).get("features", []) if config else []
        if "content.code.copy" not in features:
            failures.append(f"{page}: code copy buttons are off (theme.features lacks content.code.copy)")
        for block in re.findall(r'<div class="language-cuda highlight">(.*?)</pre>', text, re.DOTALL):
            if not re.search(r'<span class="(k|kt|kr|kd|n|nf|o|p|mi|c1|cm)">', block):
                failures.append(f"{page}: a ```cuda block has no highlighting spans (pymdownx.highlight / pygments?)")
                break
        lesson = LESSON.match(page)
        if lesson:
            failures += lesson_checks(site, page, lesson.group(1), parser, text)
    if not any('class="language-cuda highlight"' in t for t in texts.values()):
        failures.append("no page has a highlighted ```cuda block (expected in the lesson pages)")
    failures += search_index_checks(site, parsed)
    return pages, failures, parsed


def lesson_checks(site: Path, page: str, name: str, parser: PageParser, text: str) -> list[str]:
    failures = []
    wanted = f"bench/{name}.svg"
    images = [src for src in parser.images if posixpath.normpath(posixpath.join(posixpath.dirname(page), src)) == wanted]
    if not images:
        failures.append(f"{page}: no benchmark figure: the page needs `<!-- bench: {name} -->` and "
                        f"site/data/bench/{name}.json (an <img> of {wanted})")
    svg = site / wanted
    if not svg.is_file() or svg.stat().st_size == 0:
        failures.append(f"{page}: the benchmark figure {wanted} is missing or empty")
    else:
        try:
            root = ET.parse(svg).getroot()
            if not root.tag.endswith("svg"):
                failures.append(f"{wanted}: not an SVG (root element {root.tag})")
        except ET.ParseError as error:
            failures.append(f"{wanted}: not well-formed SVG: {error}")
    if "md-footer__link--prev" not in text:
        failures.append(f"{page}: no 'Previous' link in the footer (theme.features navigation.footer)")
    if 'class="admonition example"' not in text or "colab.research.google.com" not in text:
        failures.append(f"{page}: no lab box with an Open in Colab link (site/hooks/lessons.py)")
    return failures


def search_index_checks(site: Path, parsed: dict[str, PageParser]) -> list[str]:
    index = site / "search" / "search_index.json"
    if not index.is_file():
        return [f"no search index at {index.relative_to(site)} (is the search plugin on?)"]
    try:
        docs = json.loads(index.read_text()).get("docs", [])
    except json.JSONDecodeError as error:
        return [f"search index is not JSON: {error}"]
    titles = {clean_title(d.get("title", "")) for d in docs}
    failures = []
    for page, parser in parsed.items():
        if LESSON.match(page) and parser.h1:
            title = clean_title(parser.h1[0])
            if title not in titles:
                failures.append(f"search index lacks the lesson title {title!r} ({page})")
    return failures


# ====================================================================== the local server
def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


# ====================================================================== DevTools protocol
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


class DevTools:
    """One page target: commands with replies, and the events that arrive meanwhile."""

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

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails'].get('text')}: "
                               f"{result['exceptionDetails'].get('exception', {}).get('description', '')}")
        return result["result"].get("value")

    def drain(self, seconds: float) -> None:
        self.wait_for("__none__", seconds)


def find_chromium(explicit: str | None) -> str | None:
    for name in ([explicit] if explicit else []) + ["chromium", "chromium-browser", "google-chrome", "chrome"]:
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


class Browser:
    def __init__(self, chromium: str, timeout: float):
        self.profile = tempfile.mkdtemp(prefix="site-check-chromium-")
        command = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                   "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   "--hide-scrollbars", "--mute-audio", f"--user-data-dir={self.profile}",
                   "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                   f"--window-size={WIDTH},{HEIGHT}", "about:blank"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        port = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line:
                if self.process.poll() is not None:
                    break
                continue
            self.stderr.append(line)
            match = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if match:
                port = int(match.group(1))
                break
        if port is None:
            self.close()
            raise RuntimeError("chromium did not start its DevTools endpoint; its output:\n" + "".join(self.stderr[-20:]))
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        targets = json.load(urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout))
        page = next(t for t in targets if t.get("type") == "page")
        self.tab = DevTools(page["webSocketDebuggerUrl"], timeout)

    def _drain_stderr(self):
        for line in self.process.stderr:
            self.stderr.append(line)

    def close(self):
        if getattr(self, "tab", None):
            self.tab.ws.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


# What the page tells us about itself once loaded (run in the page).
PAGE_PROBE = r"""
(async () => {
  // Let Material's scripts finish (copy buttons are added after load).
  await new Promise(r => setTimeout(r, 300));
  const images = Array.from(document.images);
  await Promise.all(images.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })));
  const broken = images.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.getAttribute('src'));
  const body = document.body.cloneNode(true);
  body.querySelectorAll('pre, code, script, style, textarea, .md-search').forEach(e => e.remove());
  const prose = body.textContent;
  const leftovers = ['\\(', '\\[', '$$'].filter(t => prose.includes(t));
  // Material 9.6+ puts the copy button in pre > nav.md-code__nav; older ones in pre directly.
  const blocks = Array.from(document.querySelectorAll('.md-content pre')).filter(p => p.querySelector('code'));
  const copy = blocks.filter(p => p.querySelector('button[data-md-type="copy"], button.md-clipboard'));
  return {
    title: document.title,
    broken_images: broken,
    tex_leftovers: leftovers,
    // A snippet marker left as a line of a code block, or anywhere in the prose (inline code may
    // mention the syntax).
    snippet_markers: prose.includes('--8<--') || Array.from(document.querySelectorAll('pre'))
      .some(p => /^\s*(\/\/|#)?\s*-{2,}8<-{2,}\s/m.test(p.textContent)),
    arithmatex: Array.from(document.querySelectorAll('.arithmatex')).length,
    code_blocks: blocks.length,
    copy_buttons: copy.length,
    palette: !!document.querySelector('form[data-md-component="palette"] label'),
  };
})()
"""


def browser_checks(browser: Browser, base: str, pages: list[str], out: Path, lesson_pages: list[str],
                   failures: list[str], notes: list[str]) -> None:
    tab = browser.tab
    for domain in ("Page", "Runtime", "Log", "Network"):
        tab.call(f"{domain}.enable")
    tab.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
    host = urlsplit(base).netloc
    shots = {"index.html": "home.png"}
    if lesson_pages:
        shots[lesson_pages[0]] = "lesson-00.png" if lesson_pages[0].startswith("00-") else f"lesson-{lesson_pages[0][:2]}.png"

    def load(page: str) -> dict | None:
        tab.events.clear()
        tab.call("Page.navigate", url=base + page)
        if not tab.wait_for("Page.loadEventFired", 30):
            failures.append(f"{page}: did not finish loading in 30 s")
            return None
        info = tab.evaluate(PAGE_PROBE)
        tab.drain(0.3)
        return info

    for page in pages:
        info = load(page)
        if info is None:
            continue
        problems = page_events(tab.events, host)
        if info["broken_images"]:
            problems.append(f"images that did not load: {', '.join(info['broken_images'])}")
        if info["tex_leftovers"] or info["arithmatex"]:
            problems.append(f"unrendered math in the page text: {info['tex_leftovers'] or 'class=arithmatex'}")
        if info["snippet_markers"]:
            problems.append("unrendered snippet marker `--8<--` in the page")
        if info["copy_buttons"] < info["code_blocks"]:
            problems.append(f"{info['code_blocks'] - info['copy_buttons']} of {info['code_blocks']} code blocks have no copy button")
        if page != "404.html" and not info["palette"]:
            problems.append("no palette toggle in the header")
        failures += [f"{page}: {p}" for p in problems]
        notes.append(f"  {'ok':6} {page}  ({info['title']}; {info['code_blocks']} code blocks)")
        if page in shots:
            screenshot(tab, out / shots[page])
            if LESSON.match(page):
                figure(tab, out / shots[page].replace(".png", "-bench.png"))

    # Search: each lesson's title, typed into the search box, finds that lesson.
    for page in lesson_pages:
        problems = search_check(tab, base, page)
        failures += problems
        notes.append(f"  {'ok' if not problems else 'FAILED':6} search finds {page} by its title")
    # Dark mode: the toggle switches the scheme; a screenshot to look at.
    if lesson_pages:
        load(lesson_pages[0])
        before = tab.evaluate("document.body.getAttribute('data-md-color-scheme')")
        tab.evaluate("document.querySelector('form[data-md-component=\"palette\"] label:not([hidden])').click()")
        tab.drain(0.5)
        after = tab.evaluate("document.body.getAttribute('data-md-color-scheme')")
        if before == after or after != "slate":
            failures.append(f"dark mode: the palette toggle did not switch to the dark scheme ({before} -> {after})")
        else:
            notes.append(f"  ok     dark mode: the palette toggle switches {before} -> {after}")
        screenshot(tab, out / shots[lesson_pages[0]].replace(".png", "-dark.png"))
        figure(tab, out / shots[lesson_pages[0]].replace(".png", "-bench-dark.png"))
        problems = page_events(tab.events, host)
        failures += [f"{lesson_pages[0]} (dark): {p}" for p in problems]
        tab.evaluate("localStorage.clear()")


def search_check(tab: DevTools, base: str, page: str) -> list[str]:
    tab.events.clear()
    tab.call("Page.navigate", url=base + page)
    tab.wait_for("Page.loadEventFired", 30)
    title = tab.evaluate("document.querySelector('.md-content h1').textContent.replace('¶','').trim()")
    query = re.sub(r"^\d\d\s*[·:.-]?\s*", "", title)
    tab.evaluate("document.querySelector('.md-search__input').focus()")
    tab.call("Input.insertText", text=query)
    tab.call("Input.dispatchKeyEvent", type="keyUp", key="e", code="KeyE")
    deadline = time.monotonic() + 15
    hrefs: list[str] = []
    while time.monotonic() < deadline:
        hrefs = tab.evaluate("Array.from(document.querySelectorAll('.md-search-result__item > a'))"
                             ".map(a => a.getAttribute('href'))") or []
        if hrefs:
            break
        time.sleep(0.3)
    name = page.split("/")[0].removesuffix(".html")
    if not any(name in h for h in hrefs[:3]):
        return [f"search: typing {query!r} did not find {page} in the top results (got {hrefs[:3] or 'nothing'})"]
    return []


def page_events(events: list[dict], host: str) -> list[str]:
    problems = []
    for event in events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            problems.append(f"console error: {text[:300]}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            problems.append(f"uncaught exception: {details.get('exception', {}).get('description', details.get('text'))}"[:400])
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            problems.append(f"console error ({entry.get('source')}): {entry.get('text', '')[:300]} {entry.get('url', '')}")
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            parts = urlsplit(url)
            if parts.scheme in ("http", "https", "ws", "wss") and parts.netloc != host:
                problems.append(f"request leaves the site (must work offline): {url}")
        elif method == "Network.responseReceived":
            response = params.get("response", {})
            if response.get("status", 200) >= 400:
                problems.append(f"HTTP {response['status']} for {response.get('url')}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            problems.append(f"request failed: {params.get('errorText')} ({params.get('type')})")
    return list(dict.fromkeys(problems))


def screenshot(tab: DevTools, path: Path, clip: dict | None = None) -> None:
    params = {"format": "png"}
    if clip:
        params.update(clip=dict(clip, scale=1), captureBeyondViewport=True)
    data = tab.call("Page.captureScreenshot", **params)["data"]
    path.write_bytes(base64.b64decode(data))


def figure(tab: DevTools, path: Path) -> None:
    """A screenshot of the page's benchmark figure and table, to look at in both schemes."""
    box = tab.evaluate("""(() => {
      const f = document.querySelector('figure.bench'); if (!f) return null;
      const t = f.nextElementSibling; const a = f.getBoundingClientRect();
      const b = (t || f).getBoundingClientRect();
      return {x: a.left + scrollX - 8, y: a.top + scrollY - 8, width: Math.max(a.width, b.width) + 16,
              height: b.bottom - a.top + 16};
    })()""")
    if box:
        screenshot(tab, path, box)


# ====================================================================== main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site_dir", nargs="?", help="the built site (default build/site)")
    parser.add_argument("--site", default=str(ROOT / "build" / "site"), help="the same, as an option")
    parser.add_argument("--out", default=str(ROOT / "build" / "site-check"), help="where screenshots go")
    parser.add_argument("--chromium", help="the browser binary (default: chromium on the PATH)")
    parser.add_argument("--timeout", type=float, default=30, help="seconds to wait for one browser reply")
    args = parser.parse_args(argv)
    site, out = Path(args.site_dir or args.site).resolve(), Path(args.out).resolve()
    if not (site / "index.html").is_file():
        print(f"browser_check: no built site at {site} (build it first: ./course site)")
        return 2
    chromium = find_chromium(args.chromium)
    if not chromium:
        print("browser_check: no chromium on the PATH (Debian: apt-get install -y chromium)")
        return 2
    out.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    pages, failures, _ = static_checks(site)
    lesson_pages = [p for p in pages if LESSON.match(p)]
    if not lesson_pages:
        failures.append("no lesson pages (NN-slug/index.html) in the built site")
    server, base = serve(site)
    notes: list[str] = []
    browser = None
    try:
        browser = Browser(chromium, args.timeout)
        browser_checks(browser, base, pages, out, lesson_pages, failures, notes)
    except (RuntimeError, TimeoutError, ConnectionError, OSError) as error:
        failures.append(f"browser: {error}")
    finally:
        if browser:
            browser.close()
        server.shutdown()

    print(f"browser_check: {len(pages)} pages of {site} in {chromium} ({time.monotonic() - started:.1f} s)")
    failed = {f.split(":", 1)[0] for f in failures}
    print("\n".join(n.replace("  ok     ", "  FAILED ", 1) if n.split()[1] in failed else n for n in notes)
          if notes else "\n".join(f"  {p}" for p in pages))
    shots = sorted(p for p in out.glob("*.png"))
    if shots:
        print("screenshots: " + ", ".join(str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p) for p in shots))
    if failures:
        print(f"\n{len(failures)} failure(s):")
        for failure in failures:
            print(f"  - {failure}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
