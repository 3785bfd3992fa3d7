"""Opens every page of the built site in headless Chromium, 1,400 px wide, and reports what a reader would see
broken: failed requests, HTTP errors, images that did not load, script errors, a page wider than the window (a wide
table must scroll in its own box), code in a table broken over lines (an option or task name split mid-word), and a
report screenshot shrunk below its own size (docs/stylesheets/extra.css). Needs Playwright and a Chromium.

    mkdocs build --strict -d /tmp/site
    python docs/browser_check.py /tmp/site [--chromium /usr/bin/chromium] [--screenshots DIR]

Exit status 1 when any page has a problem. The site is served over HTTP, as it is published (directory URLs do not
resolve from file://).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import sys
import threading
from pathlib import Path


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/"


def visit(page, found: list[str], url: str, screenshots: Path | None, name: str) -> list[str]:
    """One page: what failed to load (the tab's listeners append to `found`), and a screenshot if asked."""
    found.clear()
    page.goto(url, wait_until="load")  # after every image and script
    problems = list(found) + [f"image did not load: {src}" for src in page.eval_on_selector_all(
        "img", "imgs => imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.getAttribute('src'))")]
    problems += page.evaluate(LAYOUT)
    if screenshots:
        screenshots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=screenshots / f"{name or 'home'}.png", full_page=True)
    return problems


WIDTH = 1400  # the window: a laptop's browser

# What the layout shows a reader, as a list of problems (JavaScript, run in the page).
LAYOUT = """() => {
  const problems = [];
  const wide = document.documentElement.scrollWidth;
  if (wide > window.innerWidth) problems.push(`the page is ${wide} px wide in a ${window.innerWidth} px window`);
  for (const code of document.querySelectorAll('.md-typeset table code')) {
    const lines = new Set([...code.getClientRects()].map(r => Math.round(r.top)));
    if (lines.size > 1) problems.push(`code in a table broken over ${lines.size} lines: ${code.textContent}`);
  }
  for (const img of document.querySelectorAll('img.screenshot')) {
    if (img.complete && img.width < img.naturalWidth) {
      problems.push(`screenshot shrunk to ${img.width} of ${img.naturalWidth} px: ${img.getAttribute('src')}`);
    }
  }
  return problems;
}"""


def check(site: Path, chromium: str | None, screenshots: Path | None) -> list[str]:
    from playwright.sync_api import sync_playwright

    server, base = serve(site)
    problems = []
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("index.html") if p.parent.name != "search")
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium)
            page = browser.new_page(viewport={"width": WIDTH, "height": 900})
            found: list[str] = []
            # Leaving a page aborts its pending requests (the search worker's): only real failures count.
            page.on("requestfailed", lambda r: None if "ERR_ABORTED" in (r.failure or "") else found.append(
                f"request failed ({r.failure}): {r.url}"))
            page.on("response", lambda r: found.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
            page.on("pageerror", lambda e: found.append(f"script error: {e}"))
            for path in pages:
                url = path.removesuffix("index.html")
                problems += [f"{path}: {p}" for p in visit(page, found, base + url, screenshots, url.strip("/").replace("/", "_"))]
            browser.close()
    finally:
        server.shutdown()
    print(f"{len(pages)} pages opened, {len(problems)} problems")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=Path, help="the built site (mkdocs build -d DIR)")
    parser.add_argument("--chromium", default=None, help="a Chromium executable (default: Playwright's own)")
    parser.add_argument("--screenshots", type=Path, default=None, help="save a full-page screenshot of each page here")
    args = parser.parse_args(argv)
    problems = check(args.site, args.chromium, args.screenshots)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
