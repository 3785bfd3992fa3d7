"""What a person sees of an evaluation in MLflow's own UI: a real `mlflow server`, a real `lm_eval --model spot` run
logged to it, and every way into it opened in headless Chromium (Debian's, driven by Playwright), each in a fresh
browser, as a newcomer's: the link the run prints, the server's home page, the Experiments list, the experiment's
URL and the run's URL.

MLflow 3.10 and later open an experiment on the page of the browser's GenAI / Model training switch (GenAI unless
switched), whatever the experiment says, and show a runs table's metric columns only when a saved view or a click
picks them (docs/tracking.md). So the printed link opens the runs table with the headline columns itself; every
other way in shows the experiment's description, whose link is the one click to the same table; and the switch,
clicked once, is remembered by the browser, which then opens the run's page under the runs."""

from __future__ import annotations

import json
import re
import time

import pytest
from conftest import chromium, lm_eval_spot, write_checkpoint
from mlflow import MlflowClient

from spot_eval.tracking.writer import NOTE, VIEW_TAG

HEADLINE = ("fwd_x", "tput_x", "lossless")
ACCURACY = ("spot_gsm8k/exact_match_strict-match", "spot_gsm8k/exact_match_flexible-extract")
DESCRIPTION_LINK = "Open the runs table with the headline columns"


def noise(text: str, url: str) -> bool:
    """Console errors of MLflow's UI that say nothing about the run: it asks the auth app for the current user
    (404 on a server started without `--app-name basic-auth`), Chromium reports a ResizeObserver loop while the
    table lays out its columns."""
    return url.endswith(("/ajax-api/2.0/mlflow/users/current", "/favicon.ico")) or "ResizeObserver loop" in text


def column(metric: str) -> str:
    """The runs table's header cell of a metric column (its AG Grid column id, `metrics.<backquoted name>`)."""
    return f'.ag-header-cell[col-id="metrics.`{metric}`"]'


# Whether a header cell shows its whole text: no element in it is cut (wider content than box, an ellipsis).
WHOLE = "cell => [...cell.querySelectorAll('*')].every(e => e.scrollWidth <= e.clientWidth + 1)"


def dismiss_tips(page) -> None:
    """MLflow's GenAI overview opens with a tip ("Detect Issues in Your Traces") over a mask; a reader closes it."""
    tip = page.get_by_role("button", name="Got it")
    try:
        tip.wait_for(timeout=5_000)
    except Exception:  # noqa: BLE001 (playwright's TimeoutError: no tip this time)
        return
    tip.click()


def check_runs_table(page, experiment_id: str, metrics: list[str], expected: dict[str, float]) -> None:
    """The runs table, not the GenAI overview, with each headline column's header whole and its value rounded."""
    page.locator(column(metrics[0])).wait_for(timeout=60_000)
    assert f"/experiments/{experiment_id}/runs?" in page.url and "/overview" not in page.url, page.url
    [row] = page.locator(".ag-center-cols-container .ag-row").all()  # the parent run (its nested runs folded)
    for metric in metrics:
        header = page.locator(column(metric))
        header.wait_for(timeout=10_000)
        assert header.inner_text().strip() == metric and header.evaluate(WHOLE), metric
        value = row.locator(f'[col-id="metrics.`{metric}`"]').inner_text().strip()
        assert re.fullmatch(r"\d+(\.\d{1,4})?", value) and float(value) == pytest.approx(expected[metric]), (metric, value)


@pytest.mark.xdist_group("mlflow_server")
@pytest.mark.slow
def test_every_way_into_mlflow_reaches_the_runs_table_with_the_headline_columns(server, tmp_path, capsys):
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install '.[dev]')")
    run = lm_eval_spot(capsys, write_checkpoint(tmp_path / "ckpt"), server.uri, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    link = re.search(r"; its runs table: (\S+)$", run.stdout, re.MULTILINE)
    assert link, run.stdout[-2000:]
    client = MlflowClient(server.uri)
    experiment = client.get_experiment_by_name("spot-eval")
    [parent] = client.search_runs([experiment.experiment_id], "tags.mlflow.runName = 'spot-eval'")
    assert any(k.startswith(VIEW_TAG) for k in experiment.tags) and DESCRIPTION_LINK in experiment.tags[NOTE]
    metrics = [*(f"oracle_4/spot_gsm8k/{k}" for k in HEADLINE), *ACCURACY]
    expected = parent.data.metrics
    assert expected["oracle_4/spot_gsm8k/lossless"] == 1 and expected["oracle_4/spot_gsm8k/fwd_x"] == round(expected["oracle_4/spot_gsm8k/fwd_x"], 2)
    base, experiment_id, run_id = server.uri, experiment.experiment_id, parent.info.run_id

    def to_the_experiment(page) -> None:  # from a list of experiments: click ours
        page.get_by_role("link", name="spot-eval", exact=True).first.click()

    ways = [  # (where a reader starts, the clicks to the experiment's page; None: the page is the runs table)
        ("the printed link", link.group(1), None),
        ("the home page", f"{base}/", to_the_experiment),
        ("the Experiments list", f"{base}/#/experiments", to_the_experiment),
        ("the experiment's URL", f"{base}/#/experiments/{experiment_id}", lambda page: None),
    ]
    errors: list[str] = []
    started = time.monotonic()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])

        def fresh_page():  # a newcomer's browser: nothing remembered; wide enough that the table renders each column
            context = browser.new_context(viewport={"width": 2560, "height": 1200})
            page = context.new_page()
            page.on("console", lambda m: errors.append(f"{m.text} ({m.location.get('url', '')})") if m.type == "error" and not noise(
                m.text, m.location.get("url", "")) else None)
            page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
            return context, page

        try:
            for name, start, to_experiment in ways:
                context, page = fresh_page()
                page.goto(start)
                if to_experiment is not None:
                    to_experiment(page)
                    # Whatever page MLflow opened the experiment on (GenAI's overview by default), the experiment's
                    # description is atop it, and its link is the one click to the runs table with the headline columns.
                    dismiss_tips(page)
                    with context.expect_page() as opened:
                        page.get_by_role("link", name=DESCRIPTION_LINK).click()
                    page = opened.value
                check_runs_table(page, experiment_id, metrics, expected)
                if name == "the printed link":
                    page.screenshot(path=str(tmp_path / "mlflow-runs-table.png"))
                context.close()

            # A run's URL: the run's page opens on its description, its metrics (the short, rounded headline ones among
            # them) and its artifacts. Clicking Model training atop the sidebar, once, puts it under the runs.
            context, page = fresh_page()
            page.goto(f"{base}/#/experiments/{experiment_id}/runs/{run_id}")
            page.get_by_text("oracle_4/spot_gsm8k/fwd_x", exact=True).wait_for(timeout=60_000)
            assert page.get_by_role("tab", name="Artifacts").count() == 1
            assert page.get_by_role("link", name="The runs table with these figures as columns").count() == 1
            page.get_by_text("Model training", exact=True).click()
            page.wait_for_url(re.compile(rf"/experiments/{experiment_id}/runs\?.*workflowType=machine_learning"))
            page.goto(f"{base}/#/experiments/{experiment_id}/runs/{run_id}")
            page.get_by_text("oracle_4/spot_gsm8k/fwd_x", exact=True).wait_for(timeout=60_000)
            assert page.get_by_role("link", name="Runs", exact=True).count() >= 1
            assert page.get_by_role("link", name="Evaluations", exact=True).count() == 0  # not under GenAI
            # ... and the experiment's URL in that browser opens on the runs table.
            page.goto(f"{base}/#/experiments/{experiment_id}")
            page.wait_for_url(re.compile(rf"/experiments/{experiment_id}/runs\?"))
            context.close()
        finally:
            browser.close()
    print(f"every way into MLflow, as the test saw it ({time.monotonic() - started:.0f} s in the browser)")
    assert errors == [], json.dumps(errors, indent=1)
