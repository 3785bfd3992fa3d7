"""Regression rules and comparison tables on hand-written bundles (exact expected findings and cells)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from spot_eval.reports.compare import compare, write_comparison
from spot_eval.reports.regression import Tolerances, find_regressions, gates, mcnemar_p, method_table
from spot_eval.reports.results import Bundle, ResultsError, check_settings, combine, read_bundle, summarize
from spot_eval.reports.table2 import numbers

SETTINGS = {"target": "tiny", "block_length": 32, "gen_length": 256}


# A divergence as samples.jsonl holds it (spot_eval.harness.lossless.Divergence).
DIVERGENCE = {"index": 3, "block": 1, "step": 4, "flipped": "position", "margin": 2.5,
              "margins": {"position": 2.5, "threshold": None, "token": 4.0}}


def sample(task, doc, label, forwards, seconds, seed=0, temperature=0.0, lossless=True):
    """One samples row as a bundle holds it (spot_eval.reports.results.SAMPLE_FIELDS)."""
    return {"temperature": temperature, "seed": seed, "policy": "single", "task": task, "doc_id": doc, "repeat": 0,
            "label": label, "tokens": 100, "forwards": forwards, "steps": 100, "seconds": seconds,
            "drafter_seconds": 0.1 * seconds, "accepted_lengths": [1, 2], "lossless": lossless,
            "divergence": None if lossless else DIVERGENCE, "lossy": False, "token_divergence": 0.0, "draft_nodes": 0}


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


def test_table2_has_a_row_per_method_bolds_the_best_and_marks_losslessness(tmp_path):
    two_seeds = combine([bundle(seed=0), bundle(spot_seconds=1.0, seed=1, lossless=False)])
    [comparison] = compare(two_seeds)
    table = comparison.table()
    assert list(table.index) == ["draft-free", "Spiffy @3", "SPOT @8"]
    assert list(table.columns) == [("gsm8k", q) for q in ("tput ×", "fwd ×", "τ", "acc.", "lossless")]
    # SPOT: 4/2 = 2.0 and 4/1 = 4.0 per seed; over both seeds' sums 48/18 = 2.67, every item alike (a point interval),
    # the best; one of 12 SPOT requests diverged.
    assert table.loc["SPOT @8"].tolist() == ["**2.67 [2.67, 2.67]**", "**5.00 [5.00, 5.00]**", "**5.00**", "—", "✗ 92%"]
    assert table.loc["Spiffy @3"].tolist() == ["1.33 [1.33, 1.33]", "2.00 [2.00, 2.00]", "2.00", "—", "✓"]
    assert table.loc["draft-free"].tolist() == ["1.00", "1.00", "1.00", "—", "reference"]
    assert "block 32" in comparison.caption and "T = 0" in comparison.caption and "seeds 0, 1" in comparison.caption
    files = {p.name for p in write_comparison(two_seeds, tmp_path)}
    assert {"compare.md", "compare.html", "compare_T0.csv", "compare_throughput_ratio.png", "compare_forward_ratio.png",
            "compare_accepted_lengths.png"} <= files
    assert "| SPOT @8 | **2.67 [2.67, 2.67]** | **5.00 [5.00, 5.00]** |" in (tmp_path / "compare.md").read_text()
    page = (tmp_path / "compare.html").read_text()
    assert "<b>2.67 [2.67, 2.67]</b>" in page and 'class="dataframe table2"' in page
    assert pd.read_csv(tmp_path / "compare_T0.csv").set_index("label").loc["spot@8", "forward_mean"] == 5.0


def test_a_method_that_never_accepted_a_draft_is_inconclusive_not_lossless():
    nothing = bundle(spot_forwards=100)  # every verify advanced one step: budget=auto choosing 0, say
    [comparison] = compare(nothing)
    assert comparison.table().loc["SPOT @8", ("gsm8k", "lossless")] == "inconclusive"
    assert comparison.table().loc["Spiffy @3", ("gsm8k", "lossless")] == "✓"


def test_speculation_on_threshold_decoding_has_its_own_section_under_the_single_commit_anchor():
    rows = []
    for doc in range(3):
        rows += [{**sample("gsm8k", doc, "draft_free", 100, 4.0), "policy": "single"},
                 {**sample("gsm8k", doc, "draft_free", 50, 2.5), "policy": "threshold"},
                 {**sample("gsm8k", doc, "sets@8", 25, 2.0), "policy": "threshold"},
                 {**sample("gsm8k", doc, "spot@8", 20, 2.0), "policy": "single"}]
    accuracy = pd.DataFrame([{"temperature": 0.0, "seed": 0, "task": "gsm8k", "metric": m, "value": v, "policy": p}
                             for p, v in (("single", 0.5), ("threshold", 0.25)) for m, v in (("sample_len", 3.0), ("exact_match,strict", v))])
    [comparison] = compare(Bundle(dict(SETTINGS), [{"temperature": 0.0, "seed": 0}], pd.DataFrame(rows), pd.DataFrame(), accuracy))
    assert [policy for policy, _ in comparison.sections] == ["single", "threshold"]
    single, threshold = comparison.table("single"), comparison.table("threshold")
    assert list(single.index) == ["draft-free", "SPOT @8"] and single.loc["SPOT @8", ("gsm8k", "acc.")] == "0.50"
    assert list(threshold.index) == ["draft-free (anchor)", "threshold decoding", "SPOT-Sets @8"]
    # threshold decoding over the anchor: 4.0/2.5 s, 100/50 forwards; SPOT-Sets over threshold decoding: 2.5/2.0 s, 50/25.
    # Each with its interval over the items (every item alike here: a point).
    assert threshold.loc["threshold decoding"].tolist() == ["1.60 [1.60, 1.60]", "2.00 [2.00, 2.00]", "2.00", "0.25", "—"]
    assert threshold.loc["SPOT-Sets @8"].tolist()[:2] == ["**1.25 [1.25, 1.25]**", "**2.00 [2.00, 2.00]**"]
    assert threshold.loc["draft-free (anchor)", ("gsm8k", "lossless")] == "reference"
    alone = Bundle(dict(SETTINGS), [{"temperature": 0.0, "seed": 0}], pd.DataFrame([r for r in rows if r["policy"] == "threshold"]),
                   pd.DataFrame(), pd.DataFrame())
    [comparison] = compare(alone)  # no single-commit run: threshold decoding has no reference, SPOT-Sets keeps its own
    assert comparison.table("threshold").loc["threshold decoding"].tolist()[:2] == ["—", "—"]
    assert comparison.table("threshold").loc["SPOT-Sets @8"].tolist()[:2] == ["**1.25 [1.25, 1.25]**", "**2.00 [2.00, 2.00]**"]


def test_the_verdict_names_each_gate_with_tonight_and_the_previous_night():
    base = bundle()
    rerun = bundle(spot_seconds=2.1)
    passed = gates(method_table(rerun, base), rerun, base, [], Tolerances()).set_index("gate")
    assert passed.verdict.tolist() == ["PASS"] * 4
    assert passed.threshold.tolist() == ["0 divergent requests", "≥ previous × 0.85", "≤ previous × 1.00", "no drop at McNemar p < 0.05"]
    worse = bundle(spot_forwards=21, lossless=False)
    findings = find_regressions(worse, base, Tolerances())
    table = gates(method_table(worse, base), worse, base, findings, Tolerances())
    assert table.verdict.tolist() == ["FAIL", "PASS", "FAIL", "PASS"]
    assert table.tonight[0] == "1 of 12 requests" and table.previous[0] == "0 of 12 requests"
    assert table.tonight[2] == "1026 in all" and table.previous[2] == "1020 in all"  # 6 docs x (100 + 21 + 50) and x (100 + 20 + 50)
    alone = gates(method_table(bundle(), None), bundle(), None, [], Tolerances())
    assert alone.verdict.tolist() == ["PASS", "n/a", "n/a", "n/a"] and alone.previous.tolist() == ["—"] * 4


def test_mismatched_settings_and_corrupt_bundles_are_refused(tmp_path):
    other = bundle()
    other.settings["gen_length"] = 128
    with pytest.raises(ResultsError, match="different gen_length"):
        combine([bundle(), other])
    with pytest.raises(ResultsError, match="different block_length"):
        check_settings([SETTINGS, {**SETTINGS, "block_length": 16}], ["a", "b"])
    path = bundle().write(tmp_path / "ok.json")
    read = read_bundle(path).samples
    assert read.shape == bundle().samples.shape and set(read.policy) == {"single"}
    unpolicied = bundle()
    unpolicied.samples.drop(columns=["policy", "steps"], inplace=True)
    with pytest.raises(ResultsError, match="its samples lack policy, steps; it is truncated, corrupt or older"):
        read_bundle(unpolicied.write(tmp_path / "old.json"))
    (tmp_path / "cut.json").write_text(path.read_text()[:200])
    with pytest.raises(ResultsError, match="corrupt"):
        read_bundle(tmp_path / "cut.json")
    (tmp_path / "other.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ResultsError, match="not a spot-eval results bundle"):
        read_bundle(tmp_path / "other.json")
    with pytest.raises(ResultsError, match="does not exist"):
        read_bundle(tmp_path / "missing.json")


def test_every_ratio_has_one_definition_on_literal_requests():
    """Two requests of one seed: the ratios are of the sums (RATIOS), not means of per-request ratios."""
    rows = [{**sample("gsm8k", 0, "draft_free", 10, 2.0), "steps": 10, "accepted_lengths": [1] * 10, "tokens": 10},
            {**sample("gsm8k", 1, "draft_free", 30, 6.0), "steps": 30, "accepted_lengths": [1] * 30, "tokens": 30},
            {**sample("gsm8k", 0, "spot@8", 2, 1.0), "steps": 10, "accepted_lengths": [9, 1], "tokens": 10, "draft_nodes": 16},
            {**sample("gsm8k", 1, "spot@8", 20, 4.0), "steps": 30, "accepted_lengths": [2] * 10 + [1] * 10, "tokens": 30,
             "draft_nodes": 160}]
    row = summarize(pd.DataFrame(rows), ["task"]).set_index("label").loc["spot@8"]
    assert row.forward_ratio == 40 / 22 and row.throughput_ratio == 8.0 / 5.0
    assert row.accepted_mean == 40 / 22  # per-request means would give (5 + 1.5) / 2 = 3.25
    assert row.tokens_per_forward == 40 / 22 and row.drafter_share == 0.1 and row.mean_tree_size == 176 / 22


def test_the_nightly_and_the_comparison_print_the_same_tau_for_the_same_runs():
    """tau of the sums over requests and seeds, in the nightly's method table and in Table 2 alike: on two seeds
    of hand-written requests, and on a committed bundle."""
    committed = read_bundle(Path(__file__).parent.parent / "results" / "comparison" / "threshold-t0" / "nightly.json")
    uneven = combine([bundle(seed=0), bundle(spot_forwards=40, seed=1)])
    for runs in (uneven, committed):
        nightly = method_table(runs, None).set_index(["temperature", "task", "label"]).accepted_mean
        comparison = numbers(runs).set_index(["temperature", "task", "label"]).accepted_mean
        assert nightly.to_dict() == comparison.reindex(nightly.index).to_dict()
    sums = uneven.samples.groupby("label")[["steps", "forwards"]].sum()
    assert nightly_tau(uneven, "spot@8") == sums.loc["spot@8", "steps"] / sums.loc["spot@8", "forwards"] == 1200 / 360


def nightly_tau(runs: Bundle, label: str) -> float:
    return float(method_table(runs, None).set_index("label").loc[label, "accepted_mean"])
