"""The browser check fails on what a reader would see broken (run by ``nox -s docs-browser``).

A small site is built with the docs' own math setup (arithmatex, ``docs/javascripts/mathjax.js``,
MathJax vendored by ``tools/docs/hooks.py``); one page has a deliberately broken formula, and
hand-written pages add the other failures: MathJax missing, a CDN script, a broken link, a
console error, a formula that is never typeset (the page never becomes ready); and a page that
is slow to become ready, which passes (its load time is reported, never checked).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from browser_check import HANG_GUARD_S, PageResult, check_site, find_browser, site_pages, summary

ROOT = Path(__file__).resolve().parents[2]
BROWSER = find_browser()

pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium (apt-get install chromium)")

GOOD = r"""# Good

Inline \( \hat A_i = r_i - \bar r \) and displayed:

\[
\hat A_i = \frac{R_i - \operatorname{mean}(R)}{\operatorname{std}(R) + \epsilon}
\]

Code keeps its backslashes: `\( x \)`. [Broken](broken.md).
"""

BROKEN = r"""# Broken

A missing brace:

\[
\hat A_i = \frac{R_i - \operatorname{mean}(R)}{\operatorname{std}(R) + \epsilon
\]
"""

UNKNOWN = r"""# Unknown command

\[
\hat A_i = \notacommand{R_i - \operatorname{mean}(R)}{\operatorname{std}(R) + \epsilon}
\]
"""

CONFIG = """site_name: fixture
strict: true
theme:
  name: material
  font: false
markdown_extensions:
  - pymdownx.arithmatex:
      generic: true
extra_javascript:
  - javascripts/mathjax.js
  - javascripts/mathjax/tex-mml-chtml.js
hooks:
  - {hooks}
nav:
  - good.md
  - broken.md
  - unknown.md
"""

RAW = """<!doctype html><html><head><title>{title}</title>{head}</head>
<body><p>{body}</p></body></html>"""

#: Seconds until the slow page's formula counts as typeset (a ``mjx-container`` appears).
SLOW_S = 1.5


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("fixture-site")
    docs = work / "docs" / "javascripts"
    docs.mkdir(parents=True)
    shutil.copy(ROOT / "docs" / "javascripts" / "mathjax.js", docs / "mathjax.js")
    (work / "docs" / "good.md").write_text(GOOD)
    (work / "docs" / "broken.md").write_text(BROKEN)
    (work / "docs" / "unknown.md").write_text(UNKNOWN)
    (work / "mkdocs.yml").write_text(CONFIG.format(hooks=ROOT / "tools" / "docs" / "hooks.py"))
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", "site"],
        cwd=work,
        check=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    built = work / "site"
    pages = {
        "no-mathjax.html": RAW.format(title="raw", head="", body=r"\[ x^2 \] and \( y \)"),
        "cdn.html": RAW.format(
            title="cdn", head='<script src="https://cdn.example.org/m.js"></script>', body="x"
        ),
        "dead-link.html": RAW.format(
            title="dead", head="", body='<a href="nowhere/">x</a><img src="missing.png">'
        ),
        "console.html": RAW.format(
            title="console", head="<script>console.error('boom')</script>", body="x"
        ),
        # a formula no MathJax ever typesets: the page is never ready
        "never-ready.html": RAW.format(
            title="never", head="", body='<span class="arithmatex">x</span>'
        ),
        # typeset SLOW_S after the load: slow, but ready
        "slow.html": RAW.format(
            title="slow",
            head="",
            body='<span class="arithmatex">x</span><script>setTimeout(() => document'
            ".querySelector('.arithmatex').appendChild(document.createElement('mjx-container')),"
            f" {SLOW_S * 1000:.0f})</script>",
        ),
    }
    for name, html in pages.items():
        (built / name).write_text(html)
    return built


def _check(site: Path, page: str, **options: float) -> list[str]:
    assert BROWSER is not None
    [result] = check_site(site, browser=BROWSER, pages=[page], log=lambda _: None, **options)
    return result.problems


def test_pages_of_the_fixture_are_found(site: Path) -> None:
    assert {"good/", "broken/", "no-mathjax.html", "console.html"} <= set(site_pages(site))


def test_rendered_math_passes(site: Path, tmp_path: Path) -> None:
    assert BROWSER is not None
    [result] = check_site(
        site, browser=BROWSER, pages=["good/"], screenshots=tmp_path, log=lambda _: None
    )
    assert result.problems == []
    assert result.seconds > 0  # its load time is reported (a figure, not a check)


def test_formula_with_a_missing_brace_fails(site: Path) -> None:
    # MathJax never finds the end of the formula: the TeX stays on the page as typed, and the
    # page never becomes ready (no typeset formula), so a short hang guard ends the wait
    problems = _check(site, "broken/", timeout=5.0)
    assert any("raw TeX '\\\\['" in p for p in problems), problems


def test_formula_with_an_unknown_command_fails(site: Path) -> None:
    # MathJax typesets an error box in place of the formula
    problems = _check(site, "unknown/")
    assert any("formula not rendered: Undefined control sequence" in p for p in problems), problems


def test_math_without_mathjax_fails(site: Path) -> None:
    problems = _check(site, "no-mathjax.html")
    assert any("raw TeX '\\\\['" in p for p in problems), problems
    assert any("raw TeX '\\\\('" in p for p in problems), problems


def test_a_cdn_request_is_blocked_and_fails(site: Path) -> None:
    problems = _check(site, "cdn.html")
    assert any("request outside the site" in p for p in problems), problems


def test_broken_link_and_image_fail(site: Path) -> None:
    problems = _check(site, "dead-link.html")
    assert any(p.endswith("/nowhere/") for p in problems), problems
    assert any(p.endswith("/missing.png") for p in problems), problems


def test_console_error_fails(site: Path) -> None:
    problems = _check(site, "console.html")
    assert any("console error: boom" in p for p in problems), problems


def test_slow_page_passes_and_its_load_time_is_reported(site: Path) -> None:
    assert BROWSER is not None
    lines: list[str] = []
    [result] = check_site(site, browser=BROWSER, pages=["slow.html"], log=lines.append)
    assert result.problems == []
    assert result.seconds >= SLOW_S  # waited for, however long it takes (up to the hang guard)
    assert lines == [f"ok   {result.seconds:5.2f} s  slow.html"]
    fast = PageResult("good/", seconds=0.5)
    assert summary([fast, result], 9.0) == (
        f"2 pages checked in 9.0 s, slowest {result.seconds:.2f} s (slow.html)"
    )


def test_page_never_ready_within_the_hang_guard_fails(site: Path) -> None:
    assert BROWSER is not None
    assert HANG_GUARD_S >= 60  # the default waits far beyond any real load time
    # a small hang guard, so that the test does not wait out the default one
    [result] = check_site(
        site, browser=BROWSER, pages=["never-ready.html"], timeout=2, log=lambda _: None
    )
    assert any(
        p.startswith("never ready: not loaded with every formula typeset after 2 s (the hang guard")
        for p in result.problems
    ), result.problems
