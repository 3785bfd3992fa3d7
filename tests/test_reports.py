"""The reports' figures read well (no tick label over another, one style per method everywhere, units and
identity in the titles), and the HTML reports open in a real browser (headless Chromium through Playwright):
no console error, every image loaded, Table 2 with a row per method and a column group per task."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from conftest import chromium

from spot_eval.reports import plots
from spot_eval.reports.compare import write_comparison
from spot_eval.reports.nightly import build_report, load_suite
from spot_eval.reports.regression import Tolerances, find_regressions, method_table
from spot_eval.reports.report import figure_title, write
from spot_eval.reports.results import Bundle

TASKS = ["spot_gsm8k", "spot_mbpp", "spot_humaneval", "spot_math500"]
SINGLE = ["spiffy@3", "spiffy@10", "spot@8", "spot@20", "spot_gamma@8", "spot_gamma@20", "spot@auto"]
THRESHOLD = ["sets@8", "sets@20"]
IDENTITY = {"target": "target@3aa8c6c910a1", "dtype": "bfloat16", "device": "cuda:0", "gpu": "NVIDIA H200",
            "torch": "2.13.0", "transformers": "5.24.0", "lm_eval": "0.4.13", "commit": "0123456789abcdef"}


def every_method_bundle(tasks=TASKS, seeds=(0, 1, 2), temperatures=(0.0, 1.0)) -> Bundle:
    """Every method family on every task, temperature and seed, with made-up but consistent numbers."""
    rows = []
    for t in temperatures:
        for seed in seeds:
            for k, task in enumerate(tasks):
                for doc in range(2):
                    for policy, labels, forwards in (("single", ["draft_free", *SINGLE], 120), ("threshold", ["draft_free", *THRESHOLD], 60)):
                        for i, label in enumerate(labels):
                            f = forwards if label == "draft_free" else forwards // (2 + i % 3)
                            rows.append({"temperature": t, "seed": seed, "task": task, "doc_id": doc, "repeat": 0, "label": label,
                                         "policy": policy, "tokens": 100, "forwards": f, "steps": forwards,
                                         "seconds": 1.0 + 0.1 * i + 0.05 * seed + 0.1 * k, "drafter_seconds": 0.0,
                                         "accepted_lengths": [1] * (f - forwards % f) + [2 + i % 3] * (forwards % f or 1),
                                         "lossless": True, "divergence": None, "lossy": False, "token_divergence": 0.0,
                                         "draft_nodes": 0 if label == "draft_free" else 3 * f})
    accuracy = pd.DataFrame([{"temperature": t, "seed": s, "task": task, "metric": m, "value": v, "policy": p}
                             for t in temperatures for s in seeds for task in tasks for p in ("single", "threshold")
                             for m, v in (("exact_match,strict-match", 0.25), ("sample_len", 2.0), ("exact_match,flexible-extract", 0.5))])
    runs = [{"temperature": t, "seed": s, "identity": IDENTITY, "peak_memory_mb": 1284} for t in temperatures for s in seeds]
    return Bundle({"target": IDENTITY["target"], "block_length": 32, "gen_length": 128}, runs, pd.DataFrame(rows), pd.DataFrame(),
                  accuracy, "2026-12-03T12:00:00")


# -- figures ----------------------------------------------------------------------------------------------


def test_the_overlap_check_sees_crowded_labels():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_xticks(range(30), [f"spot_gsm8k\nspot@{i}" for i in range(30)])
    assert len(plots.overlapping_labels(fig)) > 10
    plt.close(fig)


def test_no_figure_draws_a_tick_label_over_another():
    many_tasks = every_method_bundle(tasks=[f"spot_task_{i}" for i in range(8)], seeds=(0,))
    from spot_eval.reports import table2

    numbers = table2.numbers(many_tasks)
    title = figure_title("wall-clock speed-up over draft-free decoding", IDENTITY, "2026-12-03")
    trend = pd.DataFrame([{"time": pd.Timestamp("2026-11-01") + pd.Timedelta(days=d), "label": label,
                           "throughput_ratio": 1 + 0.01 * d, "forward_ratio": 2 + 0.01 * d} for d in range(30) for label in SINGLE])
    figures = {"bars": plots.bars_figure(numbers, "throughput", "throughput × over draft-free", title),
               "histogram": plots.histogram_figure(many_tasks.samples, title),
               "trend": plots.trend_figure(trend, title)}
    for name, fig in figures.items():
        assert plots.overlapping_labels(fig) == [], name
        assert all("×" in ax.get_ylabel() or "share" in ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()), name
        assert "bfloat16" in fig.get_suptitle() + "".join(ax.get_title() for ax in fig.axes), name
        plt.close(fig)
    bars = plots.bars_figure(numbers, "throughput", "throughput × over draft-free", title)
    legend = [t.get_text() for t in bars.legends[0].get_texts()]
    assert legend[:2] == ["Spiffy @3", "Spiffy @10"] and "SPOT-Sets @8 (over threshold decoding)" in legend
    assert len(legend) == len(SINGLE) + len(THRESHOLD) + 1  # and threshold decoding itself, over the anchor
    assert "H200" in title and "commit 0123456789" in title
    plt.close(bars)


def test_a_method_has_one_style_in_every_figure():
    assert plots.style("spot@8") == plots.style("spot@8") and plots.style("spot@8")["hatch"] == ""
    assert plots.style("spot@20")["color"] == plots.style("spot@8")["color"] and plots.style("spot@20")["hatch"] == "//"
    assert plots.style("spot@auto")["hatch"] == "xx"
    families = ["spiffy@3", "spot@8", "spot_gamma@8", "sets@8", "sets_max@8", "draft_free"]
    assert len({plots.style(label)["color"] for label in families}) == len(families)


# -- the pages in a browser -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install '.[dev]')")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield browser
        browser.close()


def open_page(browser, page_path: Path, screenshot: Path) -> dict:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_path.as_uri())
    page.wait_for_load_state("load")
    seen = page.evaluate("""() => ({
        images: [...document.images].map(i => ({alt: i.alt, width: i.naturalWidth, complete: i.complete,
                                                height: i.getBoundingClientRect().height})),
        title: document.querySelector('h1')?.textContent || '',
        headings: [...document.querySelectorAll('h2')].map(h => h.textContent.trim()),
        tables: [...document.querySelectorAll('table.table2')].map(t => ({
            rows: [...t.querySelectorAll('tbody tr th')].map(th => th.textContent.trim()),
            groups: [...t.querySelectorAll('thead tr:first-child th')].filter(th => th.colSpan > 1)
                        .map(th => [th.textContent.trim(), th.colSpan])})),
        verdicts: [...document.querySelectorAll('span.pass, span.fail, span.na')].map(s => [s.className, s.textContent]),
        identity: document.querySelector('dl.identity')?.textContent || '',
    })""")
    page.screenshot(path=str(screenshot), full_page=True)
    page.close()
    return {**seen, "errors": errors}


@pytest.mark.slow
def test_the_comparison_and_the_nightly_report_open_in_a_browser(browser, tmp_path):
    bundle = every_method_bundle()
    write_comparison(bundle, tmp_path / "compare", date="2026-12-03")
    seen = open_page(browser, tmp_path / "compare" / "compare.html", tmp_path / "compare.png")
    assert seen["errors"] == []
    assert len(seen["images"]) == 4 and all(i["complete"] and i["width"] > 0 for i in seen["images"])
    assert seen["headings"][:2] == ["Verdict", "Against the rivals and the bound"]
    # Per temperature: the single-commit section and the threshold section, each a row per method, 5 columns per task.
    assert len(seen["tables"]) == 4
    single, threshold = seen["tables"][:2]
    assert single["rows"] == ["draft-free", "Spiffy @3", "Spiffy @10", "SPOT @8", "SPOT @20", "SPOT-γ @8", "SPOT-γ @20", "SPOT @auto"]
    assert threshold["rows"] == ["draft-free (anchor)", "threshold decoding", "SPOT-Sets @8", "SPOT-Sets @20"]
    assert single["groups"] == [[t.removeprefix("spot_"), 5] for t in sorted(TASKS)]
    assert "NVIDIA H200" in seen["identity"] and "0123456789abcdef" in seen["identity"]
    assert (tmp_path / "compare.png").stat().st_size > 10_000

    degraded = every_method_bundle()
    degraded.samples.loc[degraded.samples.label == "spot@8", "forwards"] += 5
    findings = find_regressions(degraded, bundle, Tolerances())
    report_dir = tmp_path / "nightly"
    report_dir.mkdir()
    trend = pd.DataFrame([{"time": pd.Timestamp("2026-12-01") + pd.Timedelta(days=d), "label": label, "throughput_ratio": 1.0,
                           "forward_ratio": 2.0} for d in range(3) for label in SINGLE])
    report = build_report(load_suite(None), degraded, bundle, "nightly run x", findings, method_table(degraded, bundle), trend,
                          report_dir, "2026-12-03")
    write(report, report_dir)
    seen = open_page(browser, report_dir / "report.html", tmp_path / "nightly.png")
    assert seen["errors"] == [] and all(i["complete"] and i["width"] > 0 for i in seen["images"])
    assert [alt for alt in (i["alt"] for i in seen["images"]) if "trend" in alt or "ratios per nightly" in alt]
    assert seen["verdicts"] == [["pass", "PASS"], ["pass", "PASS"], ["fail", "FAIL"], ["pass", "PASS"]]
    headings = report.sections
    assert [s.heading for s in headings][:4] == ["Verdict", "What the runs found", "Findings", "Table 2 at T = 0"]
    print(f"screenshots: {tmp_path / 'compare.png'}, {tmp_path / 'nightly.png'}")


COMMITTED = Path(__file__).resolve().parent.parent / "results"


@pytest.mark.slow
def test_the_committed_reports_say_what_they_found_with_readable_figures(browser, tmp_path):
    """The committed comparison and the third night of the committed example nightly, at 1,400 px: the verdict first,
    the day they ran in the header, a trend in the nightly, and every figure at least 250 px tall."""
    comparison = open_page(browser, COMMITTED / "comparison" / "compare.html", tmp_path / "compare.png")
    nightly = open_page(browser, COMMITTED / "nightly" / "night-3" / "report.html", tmp_path / "nightly.png")
    for seen in (comparison, nightly):
        assert seen["errors"] == [] and all(i["complete"] for i in seen["images"])
        assert [i["alt"] for i in seen["images"] if i["height"] < 250] == []
        assert re.search(r"date\s*2026-\d\d-\d\d", seen["identity"]), seen["identity"]
    assert comparison["headings"][:2] == ["Verdict", "Against the rivals and the bound"]
    assert nightly["headings"][:2] == ["Verdict", "What the runs found"]
    assert re.match(r"spot-eval nightly 2026-\d\d-\d\d: suite example", nightly["title"])
    assert [i for i in nightly["images"] if "per nightly" in i["alt"]]  # the trend over the three nights


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", path
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


@pytest.mark.slow
def test_the_docs_report_pictures_are_taken_from_the_committed_reports(browser, tmp_path, monkeypatch):
    """docs/screenshots.py renders each committed report at 1,400 px into the picture the docs show."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("screenshots", COMMITTED.parent / "docs" / "screenshots.py")
    screenshots = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, screenshots)  # its dataclass looks its module up there
    spec.loader.exec_module(screenshots)
    shots = tuple(screenshots.Shot(s.report, tmp_path / s.image.name, s.height) for s in screenshots.SHOTS)
    taken = screenshots.take(shots, browser)
    for shot, committed, image in zip(shots, screenshots.SHOTS, taken, strict=True):
        assert shot.report.is_file() and png_size(image) == png_size(committed.image) == (screenshots.WIDTH, shot.height)
