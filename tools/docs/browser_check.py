r"""Open every page of a built docs site in a real browser and fail on what a reader would see.

``nox -s docs-browser`` builds the site and runs this on it; run it by hand on any built site::

    python tools/docs/browser_check.py site --screenshots shots/

The site is served by ``http.server`` on 127.0.0.1 (a free port) and each page is opened in the
system's Chromium (``--browser``, default ``$CHROMIUM`` or ``chromium`` on PATH), driven by
Playwright; Playwright's own browser builds are never used. Every request that does not go to the
local server is blocked, as on a machine with no network. Each page is waited for until it is
ready (loaded, and every formula (``.arithmatex``) typeset by MathJax), and its load time is
reported, per page and the slowest: a figure, never a failure (speed is measured by benchmarks,
not checked here). A page fails on:

* never becoming ready: still not ready after ``--timeout`` seconds (120), a hang guard far
  beyond any real load time, so that a page that never loads or typesets ends the check with a
  message instead of hanging it;
* a TeX delimiter (``\(``, ``\)``, ``\[``, ``\]``, ``$$``) left in the visible text outside
  code (MathJax not loaded, or a formula it never found the end of: a missing brace), or a
  formula MathJax could not parse (``mjx-merror``: an unknown command);
* a console error or an uncaught exception;
* a request outside the site (a CDN reference), or a local request answered >= 400 (a missing
  font, script, stylesheet);
* an internal ``<a href>`` or ``<img src>`` that the local server does not answer with 200.

A screenshot of each page under ``algorithms/`` and ``packages/`` (scrolled to its first
displayed formula) goes to ``--screenshots``. Exit status 1 when a page failed.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urlsplit

#: Pages whose screenshot is saved (prefixes of the path inside the site).
SCREENSHOT_PREFIXES = ("algorithms/", "packages/")

#: Ready when the page has loaded and MathJax has typeset every formula.
_READY_JS = """() => document.readyState === 'complete' &&
    [...document.querySelectorAll('.arithmatex')].every(e => e.querySelector('mjx-container'))"""

#: Visible text outside code blocks, code spans, scripts and typeset math.
_VISIBLE_TEXT_JS = """() => {
  const skip = 'pre, code, script, style, mjx-container, textarea';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const parts = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || el.closest(skip) || !el.checkVisibility()) continue;
    parts.push(n.textContent);
  }
  return parts.join(' ');
}"""

#: Messages of the formulas MathJax could not parse.
_MATH_ERRORS_JS = """() => [...document.querySelectorAll('mjx-merror')].map(
    e => (e.getAttribute('data-mjx-error') || e.textContent).trim())"""

#: Absolute URLs of every link and image.
_LINKS_JS = """() => [
  ...[...document.querySelectorAll('a[href]')].map(a => a.href),
  ...[...document.querySelectorAll('img[src]')].map(i => i.src),
]"""

TEX_DELIMITERS = ("\\(", "\\)", "\\[", "\\]", "$$")

#: Seconds a page (and each other browser or local-server wait) may take before it counts as
#: hung. A hang guard, not a speed limit: a slow page passes and its time is reported.
HANG_GUARD_S = 120.0


@dataclass
class PageResult:
    """What happened to one page."""

    path: str
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    screenshot: Path | None = None


def site_pages(site: Path) -> list[str]:
    """The HTML pages of a built site, as paths relative to it (``404.html`` left out)."""
    pages = []
    for html in sorted(site.rglob("*.html")):
        rel = html.relative_to(site).as_posix()
        if rel == "404.html" or rel.startswith(("assets/", "javascripts/")):
            continue
        pages.append(rel.removesuffix("index.html"))
    return pages


def find_browser() -> str | None:
    """The system Chromium: ``$CHROMIUM``, else ``chromium`` or ``chromium-browser`` on PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a tab closed mid-download
            super().handle_error(request, client_address)


@contextmanager
def serve(site: Path) -> Iterator[str]:
    """Serve ``site`` on 127.0.0.1 (a free port); yield its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _status(url: str, cache: dict[str, int], timeout: float = HANG_GUARD_S) -> int:
    if url not in cache:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                cache[url] = response.status
        except urllib.error.HTTPError as err:
            cache[url] = err.code
        except OSError:
            cache[url] = 0
    return cache[url]


def check_page(
    context: Any,
    base: str,
    path: str,
    *,
    timeout: float = HANG_GUARD_S,
    screenshots: Path | None = None,
    link_cache: dict[str, int] | None = None,
) -> PageResult:
    """Open ``base + path`` in a new tab of ``context`` and collect its problems.

    ``timeout`` is a hang guard: the page fails only when it is still not ready after it;
    ``PageResult.seconds`` is the time it took to be ready (a figure, not a check).
    """
    result = PageResult(path or "index.html")
    link_cache = {} if link_cache is None else link_cache
    origin = urlsplit(base).netloc
    page = context.new_page()
    page.set_default_timeout(timeout * 1000)  # screenshots and waits: a hang guard as well
    problems = result.problems
    page.on(
        "console",
        lambda msg: problems.append(f"console error: {msg.text}") if msg.type == "error" else None,
    )
    page.on("pageerror", lambda exc: problems.append(f"uncaught exception: {exc}"))

    def on_response(response: Any) -> None:
        if urlsplit(response.url).netloc == origin and response.status >= 400:
            problems.append(f"HTTP {response.status} for {response.url}")

    page.on("response", on_response)
    start = time.perf_counter()
    try:
        page.goto(base + path, wait_until="load", timeout=timeout * 1000)
        remaining = max(timeout - (time.perf_counter() - start), 0.001)
        page.wait_for_function(_READY_JS, timeout=remaining * 1000)
    except Exception as err:  # playwright's TimeoutError and navigation errors
        problems.append(
            f"never ready: not loaded with every formula typeset after {timeout:g} s (the hang "
            f"guard, --timeout): {' '.join(str(err).split())[:300]}"
        )
        try:  # inspect what the page shows once it has loaded after all
            page.wait_for_url(base + path, wait_until="load", timeout=10_000)
        except Exception:
            problems.append("not even loaded after 10 s more")
    result.seconds = time.perf_counter() - start

    text = page.evaluate(_VISIBLE_TEXT_JS)
    for delim in TEX_DELIMITERS:
        at = text.find(delim)
        if at >= 0:
            snippet = " ".join(text[max(at - 30, 0) : at + 50].split())
            problems.append(f"raw TeX {delim!r} in the visible text: ...{snippet}...")
    problems.extend(f"formula not rendered: {msg}" for msg in page.evaluate(_MATH_ERRORS_JS))
    for url in sorted(set(page.evaluate(_LINKS_JS))):
        target, _ = urldefrag(url)
        if urlsplit(target).netloc != origin:
            continue
        status = _status(target, link_cache, timeout)
        if status != 200:
            problems.append(f"broken internal link or image ({status}): {target}")

    if screenshots is not None and path.startswith(SCREENSHOT_PREFIXES):
        screenshots.mkdir(parents=True, exist_ok=True)
        page.evaluate(
            "() => { const m = document.querySelector('div.arithmatex')"
            " || document.querySelector('.arithmatex');"
            " if (m) m.scrollIntoView({block: 'center'}); }"
        )
        page.wait_for_timeout(300)  # the theme's header settles after a scroll
        result.screenshot = screenshots / (path.strip("/").replace("/", "_") + ".png")
        page.screenshot(path=str(result.screenshot))
    page.close()
    return result


@contextmanager
def browser_context(executable: str) -> Iterator[Any]:
    """A Playwright context in the Chromium at ``executable`` that reaches 127.0.0.1 only."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        blocked: list[str] = []

        def route(route: Any) -> None:
            if urlsplit(route.request.url).hostname == "127.0.0.1":
                route.continue_()
            else:
                blocked.append(route.request.url)
                route.abort("internetdisconnected")

        context.route("**/*", route)
        context.blocked = blocked
        try:
            yield context
        finally:
            browser.close()


def check_site(
    site: Path,
    *,
    browser: str,
    pages: list[str] | None = None,
    timeout: float = HANG_GUARD_S,
    screenshots: Path | None = None,
    log: Any = print,
) -> list[PageResult]:
    """Check ``pages`` (default: every page) of the built ``site``; log one line per page.

    Each line gives the page's load time; ``timeout`` is the hang guard of :func:`check_page`.
    """
    pages = site_pages(site) if pages is None else pages
    results = []
    with serve(site) as base, browser_context(browser) as context:
        link_cache: dict[str, int] = {}
        for path in pages:
            before = len(context.blocked)
            result = check_page(
                context, base, path, timeout=timeout, screenshots=screenshots,
                link_cache=link_cache,
            )  # fmt: skip
            result.problems.extend(
                f"request outside the site (blocked): {url}" for url in context.blocked[before:]
            )
            status = "FAIL" if result.problems else "ok"
            log(f"{status:4} {result.seconds:5.2f} s  {result.path}")
            for problem in result.problems:
                log(f"       {problem}")
            results.append(result)
    return results


def summary(results: list[PageResult], seconds: float) -> str:
    """The load times of a check, as figures: pages, total time, the slowest page and its time."""
    if not results:
        return f"0 pages checked in {seconds:.1f} s"
    slowest = max(results, key=lambda r: r.seconds)
    return (
        f"{len(results)} pages checked in {seconds:.1f} s, "
        f"slowest {slowest.seconds:.2f} s ({slowest.path})"
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: check a built site, exit 1 on any problem."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the built site (mkdocs build --site-dir)")
    parser.add_argument("--screenshots", type=Path, help="folder for the pages' screenshots")
    parser.add_argument("--browser", default=find_browser(), help="Chromium executable")
    parser.add_argument(
        "--timeout",
        type=float,
        default=HANG_GUARD_S,
        help="hang guard: seconds after which a page that is still not ready fails "
        "(a slow page does not fail; its load time is reported)",
    )
    args = parser.parse_args(argv)
    if args.browser is None:
        parser.error("no Chromium found: install it (apt-get install chromium) or pass --browser")
    start = time.perf_counter()
    results = check_site(
        args.site, browser=args.browser, timeout=args.timeout, screenshots=args.screenshots
    )
    failed = [r for r in results if r.problems]
    print(f"{summary(results, time.perf_counter() - start)}; {len(failed)} failed")
    if args.screenshots is not None:
        print(f"screenshots: {args.screenshots}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
