#!/usr/bin/env python3
"""Check the built course site the way a reader meets it: in a real (headless) browser.

    ./course run tools/site/browser_check.py [SITE] [--out build/site-check] [--chromium PATH]

Needs only the Python standard library and chromium (`apt-get install -y chromium`); the
browser plumbing is tools/site/devtools.py. It builds nothing: build the site first
(`./course site`). What `mkdocs build --strict` already fails on is not checked again here
(a markdown link or image whose file is missing; a lesson page without its lab folder,
notebook, Colab link or benchmark results: site/hooks/lessons.py and bench.py warn).
It fails, with a list, on:

  static, over every built HTML file
    - an internal href/src that does not resolve to a file, or a #fragment with no such id
      (mkdocs reports a missing anchor only at INFO level, and never looks at raw HTML links)
    - a lesson page without its benchmark figure (an <img> of bench/NN-slug.svg, which must
      exist and parse as SVG): mkdocs is silent when the `<!-- bench: -->` marker is missing.
      A lesson whose marker says pending (no GPU results yet) has a box in its place instead,
      and the home page must list that lesson as being written
    - CUDA code blocks without highlighting spans; a lesson page without a prev/next footer
  in the browser, for every page
    - console errors, uncaught exceptions, failed or 4xx/5xx requests, any request that
      leaves 127.0.0.1 (the site must work offline: no CDN, no web font)
    - an <img> that did not load; `\\(`, `\\[`, `$$` or class="arithmatex" in the text
      outside code (math not rendered); `--8<--` outside inline code
    - a code block without its copy button; a page without the palette (dark mode) toggle
  and once: typing each lesson's title into the search box finds that lesson; the palette
  toggle switches to the dark scheme.

Screenshots (1280x2000): OUT/home.png, OUT/lesson-00.png, OUT/lesson-00-dark.png, and the
benchmark figure of lesson 00 in both schemes (OUT/lesson-00-bench.png, -bench-dark.png).
Exit status 0 when everything passed, 1 on any failure, 2 when it could not run at all
(no built site, no chromium).
"""
from __future__ import annotations

import argparse
import posixpath
import re
import sys
import time
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

from devtools import INSTALL_HINT, Browser, Session, find_chromium, serve

from coursekit import trees

LESSON = re.compile(r"^(\d\d-[a-z0-9-]+)(?:/index\.html|\.html)$")
WIDTH, HEIGHT = 1280, 2000


# ====================================================================== static checks
class PageParser(HTMLParser):
    """Collects the links, images and ids of one built page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.refs: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.ids: set[str] = set()
        self.images: list[str] = []

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


def static_checks(site: Path) -> tuple[list[str], list[str]]:
    """(every page, relative to the site; the failures)."""
    failures: list[str] = []
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    texts = {page: (site / page).read_text(errors="replace") for page in pages}
    parsed = {}
    for page, text in texts.items():
        parsed[page] = PageParser()
        parsed[page].feed(text)

    for page in pages:
        parser, text = parsed[page], texts[page]
        for tag, attribute, value in parser.refs:
            target = internal_target(site, page, value)
            if target is None:
                continue
            path, fragment = target
            if path == "../" or not (site / path).is_file():
                failures.append(f"{page}: broken link <{tag} {attribute}=\"{value}\"> (no file {path})")
            elif fragment and path in parsed and unquote(fragment) not in parsed[path].ids:
                failures.append(f"{page}: <{tag} {attribute}=\"{value}\"> points at #{fragment}, which {path} lacks")
        for block in re.findall(r'<div class="language-cuda highlight">(.*?)</pre>', text, re.DOTALL):
            if not re.search(r'<span class="(k|kt|kr|kd|n|nf|o|p|mi|c1|cm)">', block):
                failures.append(f"{page}: a ```cuda block has no highlighting spans (pymdownx.highlight / pygments?)")
                break
        lesson = LESSON.match(page)
        if lesson:
            failures += lesson_checks(site, page, lesson.group(1), parser, text)
    if not any('class="language-cuda highlight"' in t for t in texts.values()):
        failures.append("no page has a highlighted ```cuda block (expected in the lesson pages)")
    return pages, failures


def lesson_checks(site: Path, page: str, name: str, parser: PageParser, text: str) -> list[str]:
    failures = []
    wanted = f"bench/{name}.svg"
    if 'bench-pending' in text:
        # A lesson not yet run on a GPU says so in place of its figure (site/hooks/bench.py); the
        # hook fails the build if its results exist, so here only the home page's word is checked.
        home = (site / "index.html").read_text(errors="replace")
        row = re.search(rf'<td><a href="{re.escape(name)}/">[^<]*</a></td>.*?course-status--([a-z-]+)', home, re.DOTALL)
        if row is None or row.group(1) != "in-progress":
            failures.append(f"{page}: the page says its GPU results are pending, but the home page does not list "
                            f"it as being written ({row.group(1) if row else 'no row found'})")
        if "md-footer__link--prev" not in text:
            failures.append(f"{page}: no 'Previous' link in the footer (theme.features navigation.footer)")
        return failures
    if not any(posixpath.normpath(posixpath.join(posixpath.dirname(page), src)) == wanted for src in parser.images):
        failures.append(f"{page}: no benchmark figure: the page needs `<!-- bench: {name} -->` (an <img> of {wanted})")
    svg = site / wanted
    try:
        root = ET.parse(svg).getroot()
        if not root.tag.endswith("svg"):
            failures.append(f"{wanted}: not an SVG (root element {root.tag})")
    except (OSError, ET.ParseError) as error:
        failures.append(f"{page}: the benchmark figure {wanted} is missing or not well-formed SVG: {error}")
    if "md-footer__link--prev" not in text:
        failures.append(f"{page}: no 'Previous' link in the footer (theme.features navigation.footer)")
    return failures


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


def browser_checks(tab: Session, base: str, pages: list[str], out: Path, lesson_pages: list[str],
                   failures: list[str], notes: list[str]) -> None:
    for domain in ("Page", "Runtime", "Log", "Network"):
        tab.call(f"{domain}.enable")
    host = urlsplit(base).netloc
    shots = {"index.html": "home.png"}
    if lesson_pages:
        shots[lesson_pages[0]] = f"lesson-{lesson_pages[0][:2]}.png"

    def load(page: str) -> dict | None:
        if not tab.navigate(base + page):
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
            problems.append(f"unrendered math in the page text: {info['tex_leftovers'] or 'class=arithmatex'} "
                            "(is site/hooks/math.py on?)")
        if info["snippet_markers"]:
            problems.append("unrendered snippet marker `--8<--` in the page")
        if info["copy_buttons"] < info["code_blocks"]:
            problems.append(f"{info['code_blocks'] - info['copy_buttons']} of {info['code_blocks']} code blocks have "
                            "no copy button (theme.features content.code.copy)")
        if page != "404.html" and not info["palette"]:
            problems.append("no palette (dark mode) toggle in the header: theme.palette needs two schemes with toggles")
        failures += [f"{page}: {p}" for p in problems]
        notes.append(f"  {'ok':6} {page}  ({info['title']}; {info['code_blocks']} code blocks)")
        if page in shots:
            tab.screenshot(out / shots[page])
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
        toggle = "document.querySelector('form[data-md-component=\"palette\"] label:not([hidden])')"
        clicked = tab.evaluate(f"(t => t ? (t.click(), true) : false)({toggle})")
        tab.drain(0.5)
        after = tab.evaluate("document.body.getAttribute('data-md-color-scheme')")
        if not clicked:
            failures.append(f"dark mode: {lesson_pages[0]} has no palette toggle to click")
        elif before == after or after != "slate":
            failures.append(f"dark mode: the palette toggle did not switch to the dark scheme ({before} -> {after})")
        else:
            notes.append(f"  ok     dark mode: the palette toggle switches {before} -> {after}")
        tab.screenshot(out / shots[lesson_pages[0]].replace(".png", "-dark.png"))
        figure(tab, out / shots[lesson_pages[0]].replace(".png", "-bench-dark.png"))
        failures += [f"{lesson_pages[0]} (dark): {p}" for p in page_events(tab.events, host)]
        tab.evaluate("localStorage.clear()")


def search_check(tab: Session, base: str, page: str) -> list[str]:
    if not tab.navigate(base + page):
        return [f"search: {page} did not finish loading in 30 s"]
    title = tab.evaluate("document.querySelector('.md-content h1')?.textContent.replace('¶','').trim()")
    if not title:
        return [f"search: {page} has no <h1> title to search for"]
    query = re.sub(r"^\d\d\s*[·:.-]?\s*", "", title)
    if not tab.evaluate("(i => i ? (i.focus(), true) : false)(document.querySelector('.md-search__input'))"):
        return [f"search: {page} has no search box (is mkdocs.yml's search plugin on?)"]
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
    """Console errors, exceptions, failed requests and requests that leave the site."""
    problems = []
    for event in events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            problems.append(f"console error: {text[:300]}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            problems.append(
                f"uncaught exception: {details.get('exception', {}).get('description', details.get('text'))}"[:400]
            )
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            problems.append(f"console error ({entry.get('source')}): "
                            f"{entry.get('text', '')[:300]} {entry.get('url', '')}")
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


def figure(tab: Session, path: Path) -> None:
    """A screenshot of the page's benchmark figure and table, to look at in both schemes."""
    box = tab.evaluate("""(() => {
      const f = document.querySelector('figure.bench'); if (!f) return null;
      const t = f.nextElementSibling; const a = f.getBoundingClientRect();
      const b = (t || f).getBoundingClientRect();
      return {x: a.left + scrollX - 8, y: a.top + scrollY - 8, width: Math.max(a.width, b.width) + 16,
              height: b.bottom - a.top + 16};
    })()""")
    if box:
        tab.screenshot(path, box)


# ====================================================================== main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site_dir", nargs="?", help=f"the built site (default {trees.SITE_BUILD})")
    parser.add_argument("--site", default=str(trees.SITE_BUILD), help="the same, as an option")
    parser.add_argument("--out", default=str(trees.BUILD / "site-check"), help="where screenshots go")
    parser.add_argument("--chromium",
                        help="the browser binary (default: the first of devtools.CHROMIUM_NAMES on the PATH)")
    parser.add_argument("--timeout", type=float, default=30, help="seconds to wait for one browser reply")
    args = parser.parse_args(argv)
    site, out = Path(args.site_dir or args.site).resolve(), Path(args.out).resolve()
    if not (site / "index.html").is_file():
        print(f"browser_check: cannot run: no built site at {site} (build it first: ./course site)")
        return 2
    chromium = find_chromium(args.chromium)
    if not chromium:
        print(f"browser_check: cannot run: no chromium {'at ' + args.chromium if args.chromium else 'on the PATH'} "
              f"({INSTALL_HINT})")
        return 2
    out.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    pages, failures = static_checks(site)
    lesson_pages = [p for p in pages if LESSON.match(p)]
    if not lesson_pages:
        failures.append("no lesson pages (NN-slug/index.html) in the built site")
    notes: list[str] = []
    try:
        with serve(site) as base, Browser(chromium, args.timeout, WIDTH, HEIGHT) as browser:
            browser_checks(browser.tab, base, pages, out, lesson_pages, failures, notes)
    except (RuntimeError, TimeoutError, ConnectionError, OSError) as error:
        failures.append(f"browser: {error}")

    print(f"browser_check: {len(pages)} pages of {site} in {chromium} ({time.monotonic() - started:.1f} s)")
    failed = {f.split(":", 1)[0] for f in failures}
    print("\n".join(n.replace("  ok     ", "  FAILED ", 1) if n.split()[1] in failed else n for n in notes)
          if notes else "\n".join(f"  {p}" for p in pages))
    shots = sorted(out.glob("*.png"))
    if shots:
        print("screenshots: " + ", ".join(str(p.relative_to(trees.ROOT) if p.is_relative_to(trees.ROOT) else p)
                                          for p in shots))
    if failures:
        print(f"\n{len(failures)} failure(s):")
        for failure in failures:
            print(f"  - {failure}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
