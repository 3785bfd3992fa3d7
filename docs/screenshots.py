"""Re-takes the report screenshots in docs/images from the committed reports, as headless Chromium shows them at
1,400 px: the comparison (README's picture, Tracking) and the newest night of the committed nightly example.
Run it after regenerating either report; needs Playwright and a Chromium.

    python docs/screenshots.py [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 1400  # the width the browser tests read the reports at (tests/test_reports.py)


@dataclass(frozen=True)
class Shot:
    report: Path
    image: Path
    height: int  # px from the top: the header, the verdict and the first table


SHOTS = (
    Shot(ROOT / "results" / "comparison" / "compare.html", ROOT / "docs" / "images" / "comparison-report.png", 1500),
    Shot(ROOT / "results" / "nightly" / "night-3" / "report.html", ROOT / "docs" / "images" / "nightly-report.png", 1100),
)


def take(shots: tuple[Shot, ...], browser) -> list[Path]:
    """Each shot's report in a new page of `browser` (Playwright's), clipped to its height and saved as its image."""
    page = browser.new_page(viewport={"width": WIDTH, "height": max(shot.height for shot in shots)})
    for shot in shots:
        page.goto(shot.report.as_uri(), wait_until="load")
        page.screenshot(path=str(shot.image), clip={"x": 0, "y": 0, "width": WIDTH, "height": shot.height})
    page.close()
    return [shot.image for shot in shots]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", help="the Chromium to drive (default: $SPOT_EVAL_CHROMIUM, as the tests, else chromium on PATH)",
                        default=os.environ.get("SPOT_EVAL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args(argv)
    if not args.chromium:
        sys.exit("docs/screenshots.py: no Chromium found; apt-get install chromium, or pass --chromium PATH")
    missing = [str(shot.report.relative_to(ROOT)) for shot in SHOTS if not shot.report.is_file()]
    if missing:
        sys.exit(f"docs/screenshots.py: no report at {', '.join(missing)}; regenerate it first (docs/tracking.md)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        taken = take(SHOTS, browser)
        browser.close()
    for image in taken:
        print(image.relative_to(ROOT))


if __name__ == "__main__":
    main()
