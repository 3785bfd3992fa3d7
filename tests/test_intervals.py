"""The intervals every report shows beside a ratio, and the padding columns, on literal records; and results written
before either was kept."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_regression import sample

from spot_eval.reports import compare, table2
from spot_eval.reports.results import (
    Bundle,
    ResultsError,
    combine,
    intervals,
    items_needed,
    mean_interval,
    newest_only,
    percentile_interval,
    ratio_replicates,
    read_bundle,
    summarize,
)

SETTINGS = {"target": "t", "block_length": 32, "gen_length": 128}


def padded(task, doc, label, forwards, after, seconds=1.0, seed=0):
    return {**sample(task, doc, label, forwards, seconds, seed), "after_eos_forwards": after}


def test_the_padding_columns_come_from_the_same_sums_as_the_ratio():
    # Draft-free: 100 forwards, 60 of them padding; the method: 40 forwards, 10 of them padding.
    rows = [padded("t", d, "draft_free", 100, 60) for d in range(2)] + [padded("t", d, "m@8", 40, 10) for d in range(2)]
    table = summarize(pd.DataFrame(rows), ["task"]).set_index("label")
    assert table.loc["m@8", "forward_ratio"] == pytest.approx(200 / 80)
    assert table.loc["m@8", "forward_ratio_to_eos"] == pytest.approx((200 - 120) / (80 - 20))  # 80 / 60
    assert table.loc["m@8", "after_eos_share"] == pytest.approx(20 / 80)
    assert table.loc["draft_free", "after_eos_share"] == pytest.approx(0.6)


def test_an_interval_holds_its_ratio_and_narrows_with_more_items():
    rng = np.random.default_rng(1)

    def records(n):
        rows = []
        for d in range(n):
            ref = int(rng.integers(80, 120))
            rows += [sample("t", d, "draft_free", ref, 1.0), sample("t", d, "m@8", int(ref / rng.uniform(1.5, 2.5)), 1.0)]
        return pd.DataFrame(rows)

    few, many = records(10), records(160)
    for samples in (few, many):
        ratio = summarize(samples, ["task"]).set_index("label").loc["m@8", "forward_ratio"]
        ci = intervals(samples, ["task"]).set_index("label").loc["m@8"]
        assert ci.forward_low < ratio < ci.forward_high
        assert "to_eos_low" not in ci.index  # no padding counts in these records: no interval of a ratio they lack
    width = {n: (lambda r: r.forward_high - r.forward_low)(intervals(s, ["task"]).set_index("label").loc["m@8"])
             for n, s in ((10, few), (160, many))}
    assert width[160] < width[10] / 2.5  # about 1 / sqrt(16) of it
    assert intervals(few, ["task"]).equals(intervals(few, ["task"]))  # seeded: the same records, the same interval


def test_every_seed_of_a_document_is_resampled_together():
    """Two seeds of one item move as one: an item whose ratio differs by seed cannot split into two independent
    draws (the interval would be too narrow). With one item, every resample is that item: the interval is a point."""
    rows = [sample("t", 0, "draft_free", 100, 1.0, seed=s) for s in (0, 1)] + [
        sample("t", 0, "m@8", f, 1.0, seed=s) for s, f in ((0, 20), (1, 80))]
    ci = intervals(pd.DataFrame(rows), ["task", "seed"]).set_index("label").loc["m@8"]
    assert ci.forward_low == pytest.approx(200 / 100) == ci.forward_high


def test_a_mean_over_tasks_has_the_interval_of_each_resamples_mean():
    replicates = {("a", "m@8"): {"forward": np.array([1.0, 2.0, 3.0])}, ("b", "m@8"): {"forward": np.array([3.0, 4.0, 5.0])},
                  ("a", "x@8"): {"forward": np.array([9.0, 9.0, 9.0])}}
    low, high = mean_interval(replicates, ("m@8",), over=0, level=0.5)
    assert (low, high) == pytest.approx(tuple(np.percentile([2.0, 3.0, 4.0], [25, 75])))
    assert np.isnan(percentile_interval(np.array([np.inf, np.nan]))[0])


def test_the_items_a_task_needs_come_from_its_widest_interval():
    # Task a: the widest cell is m@8 at ±10% on 40 items, so ±5% takes four times as many; task b is already narrower
    # than ±5% and keeps its 50 items.
    cells = pd.DataFrame([
        {"task": "a", "label": "m@4", "forward_ratio": 2.0, "forward_low": 1.9, "forward_high": 2.1},
        {"task": "a", "label": "m@8", "forward_ratio": 2.0, "forward_low": 1.8, "forward_high": 2.2},
        {"task": "a", "label": "draft_free", "forward_ratio": 1.0, "forward_low": np.nan, "forward_high": np.nan},
        {"task": "b", "label": "m@8", "forward_ratio": 3.0, "forward_low": 2.97, "forward_high": 3.03},
    ])
    plan = items_needed(cells, pd.DataFrame({"task": ["a", "b"], "items": [40, 50]}), ["task"]).set_index("task")
    assert plan.loc["a", "label"] == "m@8" and plan.loc["a", "half_width"] == pytest.approx(0.10)
    assert plan.loc["a", "needed"] == 160
    assert plan.loc["b", "needed"] == 50 and plan.loc["b", "half_width"] == pytest.approx(0.01)


def test_a_suite_and_its_continuation_pool_their_items_and_a_request_counts_once():
    def part(docs):
        rows = [sample("t", d, label, forwards, 1.0) for d in docs for label, forwards in (("draft_free", 100), ("m@8", 40))]
        return Bundle(dict(SETTINGS), [{"temperature": 0.0, "seed": 0}], pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame())

    pooled = combine([part(range(2)), part(range(2, 5))])
    assert sorted(pooled.samples.doc_id.unique()) == [0, 1, 2, 3, 4]
    assert summarize(pooled.samples, ["task"]).set_index("label").loc["m@8", "requests"] == 5
    with pytest.raises(ResultsError, match=r"1 requests are in more than one .* t document 1, m@8"):
        combine([part(range(2)), part(range(1, 3))])
    # an experiment's runs read back newest first: a request decoded twice counts once, every row from the newer run
    newer, older = part(range(1, 3)), part(range(2))
    newer.samples["seconds"] = 2.0
    both = combine(newest_only([newer, older]))
    assert sorted(both.samples.doc_id.unique()) == [0, 1, 2] and len(both.samples) == 6
    assert both.samples.set_index(["doc_id", "label"]).loc[(1, "m@8"), "seconds"] == 2.0


def test_a_part_that_adds_methods_to_decoded_requests_takes_each_against_its_own_draft_free_decode():
    """A later bundle decodes requests an earlier one holds again, draft-free beside a new method: the new method's
    ratios are against that draft-free decode (its seconds measured beside it), the earlier methods' against theirs,
    every request counts once in draft-free's row, and a method on some items only is taken over those items."""
    def part(docs, method, forwards, seconds):
        rows = [sample("t", d, label, f, s) for d in docs for label, f, s in (("draft_free", 100, 1.0 * seconds), (method, forwards, seconds))]
        return Bundle(dict(SETTINGS), [{"temperature": 0.0, "seed": 0}], pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame())

    first, more = part(range(4), "m@8", 50, 1.0), part(range(4, 8), "m@8", 50, 1.0)
    added = part(range(2), "r@8", 25, 3.0)  # its run was three times slower: draft-free too
    added.samples.loc[added.samples.label == "draft_free", "seconds"] = 6.0  # and r@8 twice as fast as draft-free
    pooled = combine([first, more, added])
    table = summarize(pooled.samples, ["task"]).set_index("label")
    assert table.loc["draft_free", "requests"] == 8 and table.loc["draft_free", "seconds"] == 8.0  # each request once
    assert table.loc["m@8", ["forward_ratio", "throughput_ratio", "requests"]].tolist() == [2.0, 1.0, 8]
    assert table.loc["r@8", ["forward_ratio", "throughput_ratio", "requests"]].tolist() == [4.0, 2.0, 2]
    ci = intervals(pooled.samples, ["task"]).set_index("label")
    assert ci.loc["r@8", "forward_low"] == pytest.approx(4.0) == ci.loc["r@8", "forward_high"]
    assert ci.loc["r@8", "throughput_low"] == pytest.approx(2.0) == ci.loc["r@8", "throughput_high"]
    # its draft-free decodes must be the earlier ones' (the same decoder on the same request), and a method once
    other = part(range(2), "r@8", 25, 1.0)
    other.samples.loc[(other.samples.label == "draft_free") & (other.samples.doc_id == 1), "forwards"] = 99
    with pytest.raises(ResultsError, match=r"draft-free decoding took different forwards on one request .*t document 1, T = 0"):
        combine([first, other])
    with pytest.raises(ResultsError, match=r"2 requests are in more than one .* t document 0, r@8"):
        combine([first, added, added])


def test_pooled_accuracy_is_over_the_items_each_once():
    """lm-eval scores each run over its own items: pooled, a suite's continuation weighs by its items, and a part that
    decodes earlier items again (adding methods) counts for none; pooled again, a pooled part keeps its weights."""
    def part(docs, score, written, method="m@8"):
        rows = [sample("t", d, label, 100, 1.0) for d in docs for label in ("draft_free", method)]
        accuracy = pd.DataFrame([{"temperature": 0.0, "seed": 0, "policy": "single", "task": task, "metric": "acc,none",
                                  "value": score} for task in ("t", "group")])  # "group": a group's aggregate, no samples
        return Bundle(dict(SETTINGS), [{"temperature": 0.0, "seed": 0}], pd.DataFrame(rows), pd.DataFrame(), accuracy,
                      f"2026-12-0{written}T00:00:00")

    first, more, added = part(range(4), 0.25, 1), part(range(4, 10), 0.5, 2), part(range(2), 1.0, 3, "r@8")
    for pooled in (combine([first, more, added]), combine([combine([first, more]), added])):
        got = compare.accuracy_table(pooled).set_index("task")["T = 0"]
        assert got["t"] == pytest.approx((4 * 0.25 + 6 * 0.5) / 10)  # the plain mean of the three runs: 0.583
        assert got["group"] == pytest.approx((0.25 + 0.5 + 1.0) / 3)  # no items to weigh it by
        assert table2._accuracy(pooled).set_index("task").loc["t", "accuracy"] == pytest.approx(0.4)
    assert "weight" not in first.accuracy.columns and compare.accuracy_table(first).set_index("task")["T = 0"]["t"] == 0.25


def test_samples_whose_index_repeats_give_the_same_figures():
    """Frames concatenated without a new index (a caller's pd.concat) repeat index labels: the references are
    matched by request, not by index label."""
    a = pd.DataFrame([sample("t", d, label, f, 1.0) for d in range(3) for label, f in (("draft_free", 100), ("m@8", 40))])
    b = pd.DataFrame([sample("t", d, label, f, 2.0) for d in range(3, 6) for label, f in (("draft_free", 100), ("m@8", 25))])
    repeated, fresh = pd.concat([a, b]), pd.concat([a, b], ignore_index=True)
    assert summarize(repeated, ["task"]).equals(summarize(fresh, ["task"]))
    assert summarize(repeated, ["task"]).set_index("label").loc["m@8", "forward_ratio"] == pytest.approx(600 / 195)
    assert intervals(repeated, ["task"]).equals(intervals(fresh, ["task"]))


def test_a_cells_interval_does_not_depend_on_what_is_pooled_beside_it():
    rows = [r for d in range(30) for r in (sample("a", d, "draft_free", 100, 1.0), sample("a", d, "m@8", 30 + d, 1.0))]
    alone = intervals(pd.DataFrame(rows), ["task"])
    other = [r for d in range(9) for r in (sample("b", d, "draft_free", 100, 1.0), sample("b", d, "m@8", 60 - d, 1.0))]
    beside = intervals(pd.DataFrame(other + rows), ["task"])
    assert beside[beside.task == "a"].reset_index(drop=True).equals(alone)


def test_the_verdict_cannot_tell_two_methods_whose_intervals_overlap():
    rows = []
    for d in range(40):
        rows += [sample("spot_gsm8k", d, "draft_free", 100, 1.0), sample("spot_gsm8k", d, "spot@8", 30 + 7 * d % 31, 1.0),
                 sample("spot_gsm8k", d, "freedave@8", 31 + 5 * d % 31, 1.0), sample("spot_gsm8k", d, "oracle@8", 12, 1.0)]
    bundle = Bundle(dict(SETTINGS), [{"temperature": 0.0, "seed": 0}], pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame())
    numbers = table2.numbers(bundle)
    said = " ".join(compare.findings(numbers, "cpu", compare.rivals(numbers)))
    assert "the interval cannot tell SPOT @8" in said and "from FreeDave @8" in said
    assert "on gsm8k the interval cannot tell" in said
    apart = [{**r, "forwards": 20} if r["label"] == "spot@8" else r for r in rows]
    bundle = Bundle(dict(SETTINGS), [{"temperature": 0.0, "seed": 0}], pd.DataFrame(apart), pd.DataFrame(), pd.DataFrame())
    numbers = table2.numbers(bundle)
    said = " ".join(compare.findings(numbers, "cpu", compare.rivals(numbers)))
    assert "gsm8k: SPOT @8 5.00 [5.00, 5.00], 55% of the bound" in said and "cannot tell" not in said


def test_the_verdict_calls_a_method_faster_than_draft_free_only_where_its_interval_lies_above_1():
    def said(seconds) -> str:  # spot@8's seconds per item against draft-free's 1.0
        rows = [r for d in range(40) for r in (sample("spot_gsm8k", d, "draft_free", 100, 1.0),
                                               sample("spot_gsm8k", d, "spot@8", 40, seconds(d)))]
        bundle = Bundle(dict(SETTINGS), [{"temperature": 0.0, "seed": 0}], pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame())
        numbers = table2.numbers(bundle)
        return " ".join(compare.findings(numbers, "cpu", compare.rivals(numbers), compare.means(bundle, numbers)))

    assert "the fastest was SPOT @8 at 1.25×, faster than draft-free decoding (the interval" in said(lambda d: 0.8)
    noisy = said(lambda d: 0.5 if d % 2 else 1.5)  # 1.00 overall, items far apart: the sums' ratio, then its spread
    assert "no method beat draft-free" in noisy
    close = said(lambda d: 0.5 if d % 2 else 1.4)  # a little faster on the whole (1.05), items far apart
    assert "cannot tell it from draft-free decoding" in close and "faster than draft-free" not in close


def test_results_written_before_intervals_and_padding_still_load_and_report(tmp_path):
    """A bundle of the old format (no after_eos_forwards, several seeds): Table 2 shows mean ± std as before, with the
    interval beside it computed from its samples; no padding column appears."""
    rows = [sample("spot_gsm8k", d, label, f, 1.0, seed=s) for s in (0, 1) for d in range(6)
            for label, f in (("draft_free", 100), ("spot@8", 40 + s))]
    old = {"format": "spot-eval-results/1", "settings": SETTINGS, "runs": [{"temperature": 0.0, "seed": 0}],
           "samples": rows, "outcomes": [], "accuracy": []}
    path = tmp_path / "nightly.json"
    path.write_text(json.dumps(old))
    numbers = table2.numbers(read_bundle(path))
    assert "after_eos_share" not in numbers and "forward_low" in numbers
    [(_, shown)] = table2.sections(numbers, 0.0)
    assert list(shown.columns.get_level_values(1).unique()) == list(table2.COLUMNS)
    assert "[" in shown.loc["SPOT @8", ("gsm8k", "fwd ×")]
    assert ratio_replicates(read_bundle(path).samples, ["task"])[("spot_gsm8k", "spot@8")].keys() == {"forward", "throughput"}


def test_the_verdict_leaves_a_method_decoded_on_fewer_tasks_out_of_the_means():
    """A mean over two tasks is not a mean over three: the method is named with its count, not crowned."""
    rows = []
    for task in ("spot_a", "spot_b", "spot_c"):
        for d in range(10):
            rows += [sample(task, d, "draft_free", 100, 1.0), sample(task, d, "spot@8", 50, 1.0)]
            if task != "spot_c":
                rows.append(sample(task, d, "r@8", 25, 1.0))
    bundle = Bundle(dict(SETTINGS), [{"temperature": 0.0, "seed": 0}], pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame())
    numbers = table2.numbers(bundle)
    said = " ".join(compare.findings(numbers, "cpu", compare.rivals(numbers)))
    assert "the most forwards saved: SPOT @8, 2.00×" in said
    assert "not averaged with the others: r @8 (2 of 3)" in said


def test_a_request_keeps_its_first_written_draft_free_decode_whatever_order_the_results_are_named_in():
    """A later part that adds a method decodes draft-free again, in another run: another policy's draft-free row stays
    measured against the request's first decode (and draft-free's own row shows that one), in any file order."""
    def part(label, seconds, created, policy="single"):
        rows = [{**sample("t", d, label, 50, seconds), "policy": policy} for d in range(3)]
        rows += [{**sample("t", d, "draft_free", 100, seconds), "policy": policy} for d in range(3)]
        return Bundle(dict(SETTINGS), [{"temperature": 0.0, "seed": 0}], pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame(),
                      created)

    first, threshold = part("m@8", 2.0, "2026-12-06T06:00:00"), part("s@8", 1.0, "2026-12-06T06:00:00", "threshold")
    added = part("r@8", 8.0, "2026-12-07T09:00:00")  # a slower run, its draft-free decodes too
    for order in ([first, threshold, added], [added, first, threshold], [threshold, added, first]):
        table = summarize(combine(order).samples, ["policy", "task"], anchor="single").set_index(["policy", "label"])
        assert table.loc[("threshold", "draft_free"), "throughput_ratio"] == 2.0  # over the first decode's 2 s, not 8 s
        assert table.loc[("single", "draft_free"), "seconds"] == 6.0
        assert table.loc[("single", "r@8"), "throughput_ratio"] == 1.0  # against its own run's draft-free


def test_a_run_directory_is_dated_by_its_record_and_a_pooled_bundle_by_its_newest_part(tmp_path):
    """A run directory sorts among results files by when its run.json was written, and pooling keeps the newest
    part's date, so pooled results pooled again keep their place: the oldest decode stays the reference."""
    import os
    import time

    from spot_eval.reports.results import DATE_FORMAT, read_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"target_id": "t", "decoder": {"seed": 0, "policy": "single", "block_length": 32,
                                                                              "gen_length": 128, "sampling": {"temperature": 0.0}}}))
    rows = [sample("t", d, label, 100 if label == "draft_free" else 50, 2.0) for d in range(3) for label in ("draft_free", "m@8")]
    (run / "samples.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k not in ("temperature", "seed", "policy")}) + "\n"
                                               for r in rows))
    when = time.mktime((2026, 12, 1, 9, 0, 0, 0, 0, -1))
    os.utime(run / "run.json", (when, when))
    old = read_run(run)
    assert old.created == "2026-12-01T09:00:00" == time.strftime(DATE_FORMAT, time.localtime(when))
    added = [{**sample("t", d, label, 100 if label == "draft_free" else 25, 8.0)} for d in range(3) for label in ("draft_free", "r@8")]
    newer = Bundle(dict(SETTINGS), [{"temperature": 0.0, "seed": 0}], pd.DataFrame(added), pd.DataFrame(), pd.DataFrame(),
                   "2026-12-07T09:00:00")
    for pooled in (combine([newer, old]), combine([newer, combine([old])])):
        table = summarize(pooled.samples, ["task"]).set_index("label")
        assert table.loc["draft_free", "seconds"] == 6.0 and pooled.created == "2026-12-07T09:00:00"
