"""Regression rules and comparison tables on hand-written bundles (exact expected findings and cells)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from spot_eval.reports.compare import compare, write_comparison
from spot_eval.reports.regression import Tolerances, find_regressions, mcnemar_p, method_table
from spot_eval.reports.results import Bundle, ResultsError, check_settings, combine, read_bundle

SETTINGS = {"target": "tiny", "block_length": 32, "gen_length": 256}


# A divergence as samples.jsonl holds it (spot_eval.harness.lossless.Divergence).
DIVERGENCE = {"index": 3, "block": 1, "step": 4, "flipped": "position", "margin": 2.5,
              "margins": {"position": 2.5, "threshold": None, "token": 4.0}}


def sample(task, doc, label, forwards, seconds, seed=0, temperature=0.0, lossless=True):
    return {"temperature": temperature, "seed": seed, "task": task, "doc_id": doc, "repeat": 0, "label": label,
            "tokens": 100, "forwards": forwards, "seconds": seconds, "drafter_seconds": 0.1 * seconds,
            "accepted_lengths": [1, 2], "lossless": lossless, "divergence": None if lossless else DIVERGENCE}


def bundle(spot_forwards=20, spot_seconds=2.0, lossless=True, right=(1, 1, 1, 1, 0, 0), seed=0):
    samples = []
    for doc in range(len(right)):
        samples += [sample("gsm8k", doc, "draft_free", 100, 4.0, seed),
                    sample("gsm8k", doc, "spot@8", spot_forwards, spot_seconds, seed, lossless=lossless or doc > 0),
                    sample("gsm8k", doc, "spiffy@3", 50, 3.0, seed)]
    outcomes = [{"temperature": 0.0, "seed": seed, "task": "gsm8k", "doc_id": d, "filter": "strict-match",
                 "metric": "exact_match", "value": float(v)} for d, v in enumerate(right)]
    return Bundle(dict(SETTINGS), [{"temperature": 0.0, "seed": seed}], pd.DataFrame(samples), pd.DataFrame(outcomes), pd.DataFrame())


def kinds(findings):
    return sorted(f.kind for f in findings)


def test_mcnemar_exact_values():
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(5, 0) == pytest.approx(2 / 32)
    assert mcnemar_p(6, 0) == pytest.approx(2 / 64)
    assert mcnemar_p(3, 3) == 1.0


def test_an_unchanged_rerun_is_not_flagged_even_with_timing_noise():
    assert find_regressions(bundle(spot_seconds=2.1), bundle(), Tolerances()) == []


def test_each_kind_of_regression_is_flagged():
    base = bundle()
    assert kinds(find_regressions(bundle(lossless=False), base, Tolerances())) == ["divergence"]
    assert kinds(find_regressions(bundle(spot_forwards=21), base, Tolerances())) == ["forwards"]
    assert kinds(find_regressions(bundle(spot_seconds=3.0), base, Tolerances())) == ["throughput"]  # 2.0x -> 1.33x
    # Accuracy: one sample lost is noise (p = 1); six lost out of six right is not (p = 2/64).
    assert find_regressions(bundle(right=(1, 1, 1, 0, 0, 0)), base, Tolerances()) == []
    base6 = bundle(right=(1,) * 6)
    [finding] = find_regressions(bundle(right=(0,) * 6), base6, Tolerances())
    assert finding.kind == "accuracy" and "6 lost, 0 gained" in finding.detail and "1.000 -> 0.000" in finding.detail


def test_a_baseline_without_shared_requests_compares_nothing():
    other = bundle(spot_forwards=90)
    other.samples["temperature"] = 1.0
    other.outcomes["temperature"] = 1.0
    assert find_regressions(bundle(), other, Tolerances()) == []
    assert "forwards_base" not in method_table(bundle(), other).columns


def test_divergences_need_no_baseline_and_name_the_request():
    [finding] = find_regressions(bundle(lossless=False), None, Tolerances())
    assert finding.where == "T=0 seed 0 gsm8k spot@8" and "first doc 0" in finding.detail
    assert "block 1 step 4: the position decision flipped (margin 2.5; the step's margins: position 2.5, token 4)" in finding.detail


def test_tolerances_are_validated():
    with pytest.raises(ValueError, match="throughput_drop"):
        Tolerances(throughput_drop=1.5)


def test_comparison_cells_bold_the_best_and_mark_losslessness(tmp_path):
    two_seeds = combine([bundle(seed=0), bundle(spot_seconds=1.0, seed=1, lossless=False)])
    [table] = compare(two_seeds)
    row = table.throughput.set_index("task").loc["gsm8k"]
    # SPOT: 4/2 = 2.0 and 4/1 = 4.0 -> 3.00 ± 1.41, the best; one of 12 SPOT requests diverged.
    assert row["SPOT @8"] == "**3.00 ± 1.41** ✗ 92%"
    assert row["Spiffy @3"] == "1.33 ± 0.00 ✓"
    assert list(table.throughput.columns) == ["task", "Spiffy @3", "SPOT @8"]
    forwards = table.forwards.set_index("task").loc["gsm8k"]
    assert forwards["SPOT @8"] == "**5.00 ± 0.00** ✗ 92%"
    assert "block 32" in table.caption and "T = 0" in table.caption and "seeds 0, 1" in table.caption
    files = {p.name for p in write_comparison(two_seeds, tmp_path)}
    assert {"compare.md", "compare.html", "compare_T0.csv", "compare_T0.png"} <= files
    assert "**3.00 ± 1.41** ✗ 92%" in (tmp_path / "compare.md").read_text()
    assert "<b>3.00 ± 1.41</b>" in (tmp_path / "compare.html").read_text()


def test_mismatched_settings_and_corrupt_bundles_are_refused(tmp_path):
    other = bundle()
    other.settings["gen_length"] = 128
    with pytest.raises(ResultsError, match="different gen_length"):
        combine([bundle(), other])
    with pytest.raises(ResultsError, match="different block_length"):
        check_settings([SETTINGS, {**SETTINGS, "block_length": 16}], ["a", "b"])
    path = bundle().write(tmp_path / "ok.json")
    assert read_bundle(path).samples.shape == bundle().samples.shape
    (tmp_path / "cut.json").write_text(path.read_text()[:200])
    with pytest.raises(ResultsError, match="corrupt"):
        read_bundle(tmp_path / "cut.json")
    (tmp_path / "other.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ResultsError, match="not a spot-eval results bundle"):
        read_bundle(tmp_path / "other.json")
    with pytest.raises(ResultsError, match="does not exist"):
        read_bundle(tmp_path / "missing.json")
