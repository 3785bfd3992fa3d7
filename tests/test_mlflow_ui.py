"""What a person sees of an evaluation in MLflow's own UI: a real `mlflow server`, a real `lm_eval --model spot` run
logged to it, and the link that run prints opened in headless Chromium (Debian's, driven by Playwright)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import pytest
from conftest import lm_eval_spot, write_checkpoint
from mlflow import MlflowClient

from spot_eval.tracking.writer import VIEW_TAG


def chromium() -> str:
    found = os.environ.get("SPOT_EVAL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("Chromium is not installed (apt-get install chromium, or set SPOT_EVAL_CHROMIUM); .ci/run installs it")
    return found


def noise(text: str, url: str) -> bool:
    """Console errors of MLflow's UI that say nothing about the run: it asks the auth app for the current user
    (404 on a server started without `--app-name basic-auth`), and Chromium reports a ResizeObserver loop while
    the table lays out its columns."""
    return (url.endswith("/ajax-api/2.0/mlflow/users/current") or url.endswith("/favicon.ico")
            or "ResizeObserver loop" in text)


def column(metric: str) -> str:
    """The runs table's header cell of a metric column (its AG Grid column id, `metrics.<backquoted name>`)."""
    return f'.ag-header-cell[col-id="metrics.`{metric}`"]'


@pytest.mark.xdist_group("mlflow_server")
@pytest.mark.slow
def test_the_printed_link_opens_the_runs_table_with_the_headline_columns(server, tmp_path, capsys):
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install '.[dev]')")
    run = lm_eval_spot(capsys, write_checkpoint(tmp_path / "ckpt"), server.uri, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    link = re.search(r"; its runs table: (\S+)$", run.stdout, re.MULTILINE)
    assert link, run.stdout[-2000:]
    client = MlflowClient(server.uri)
    experiment = client.get_experiment_by_name("spot-eval")
    [parent] = client.search_runs([experiment.experiment_id], "tags.mlflow.runName = 'spot-eval'")
    [dataset] = parent.inputs.dataset_inputs
    assert any(k.startswith(VIEW_TAG) for k in experiment.tags)

    errors: list[str] = []
    started = time.monotonic()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1920, "height": 1080})  # the table renders the columns in view
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" and not noise(
                m.text, m.location.get("url", "")) else None)
            page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
            page.goto(link.group(1))
            # The runs table, not MLflow 3's GenAI overview: the headline figures and the accuracy as columns.
            headline = page.locator(column("oracle_4/spot_gsm8k/throughput_ratio"))
            headline.wait_for(timeout=60_000)
            assert f"/experiments/{experiment.experiment_id}/runs?" in page.url and "/overview" not in page.url
            for figure in ("forward_ratio", "tokens_per_forward", "lossless"):
                page.locator(column(f"oracle_4/spot_gsm8k/{figure}")).wait_for(timeout=10_000)
            page.locator(column("spot_gsm8k/exact_match_strict-match")).wait_for(timeout=10_000)
            assert headline.inner_text().strip() == "oracle_4/spot_gsm8k/throughput_ratio"
            # One row, the parent run's (its nested runs folded under it), with its figures and its dataset input.
            page.locator(".ag-pinned-left-cols-container .ag-row", has_text="spot-eval").wait_for(timeout=10_000)
            [row] = page.locator(".ag-center-cols-container .ag-row").all()
            value = row.locator('[col-id="metrics.`oracle_4/spot_gsm8k/throughput_ratio`"]').inner_text()
            assert float(value) == pytest.approx(parent.data.metrics["oracle_4/spot_gsm8k/throughput_ratio"], rel=1e-6)
            assert f"spot_gsm8k ({dataset.dataset.digest})" in row.inner_text()
            screenshot = tmp_path / "mlflow-runs-table.png"
            page.screenshot(path=str(screenshot))
        finally:
            browser.close()
    print(f"the MLflow runs table as the test saw it ({time.monotonic() - started:.0f} s in the browser): {screenshot}")
    assert errors == [], json.dumps(errors, indent=1)
