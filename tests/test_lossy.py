"""A lossy method in the harness (sets_max: SPOT-Sets under max-commit): labelled lossy everywhere, its divergences
measured instead of failing the run, and its own outputs scored against draft-free's on the same samples."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from conftest import write_checkpoint
from lm_eval.tasks import TaskManager
from test_lm import make_lm, request
from test_regression import bundle, sample

from spot.drafters.sets import StaleSets
from spot_eval.checkpoints.fingerprint import target_fingerprint
from spot_eval.checkpoints.set_predictor import write_set_predictor
from spot_eval.checkpoints.target import load_target
from spot_eval.harness.lm import SpotArgs
from spot_eval.harness.lossless import MethodRecord, token_divergence
from spot_eval.harness.methods import parse_methods
from spot_eval.harness.session import RequestRecord, Session
from spot_eval.reports.compare import compare
from spot_eval.reports.nightly import build_report, load_suite
from spot_eval.reports.regression import Tolerances, find_regressions, method_table
from spot_eval.reports.results import read_run
from spot_eval.tracking.writer import NullTracker

TASKS = Path(__file__).resolve().parents[1] / "tasks"


def test_sets_max_is_the_one_lossy_method_and_decodes_under_max_commit():
    [lossy, exact] = parse_methods("sets_max@8+sets@8", "")
    assert lossy.lossy and not exact.lossy
    assert lossy.config(SpotArgs(unmasking="threshold").decode_config(32)).acceptance == "max_commit"
    assert exact.config(SpotArgs(unmasking="threshold").decode_config(32)).acceptance == "exact"
    with pytest.raises(ValueError, match="use policy 'threshold' .* or acceptance 'exact'"):
        lossy.config(SpotArgs().decode_config(32))
    assert token_divergence((1, 2, 3, 4), (1, 5, 3)) == 0.5 and token_divergence((), ()) == 0.0


def test_a_lossy_method_is_labelled_and_its_divergences_end_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's store and artifacts
    path = write_checkpoint(tmp_path / "ckpt")
    fingerprint = target_fingerprint(load_target(path, None), "threshold")
    sets = tmp_path / "sets.json"
    write_set_predictor(sets, fingerprint, 0.5, StaleSets(((5.0, 0.0, 0.0),)), {})
    lm = make_lm(str(path), methods=f"sets@8:{sets}+sets_max@8:{sets}", budgets="", unmasking="threshold", threshold=0.5,
                 output_dir=str(tmp_path / "run"))  # fail_on_divergence stays on: it holds for sets@8 alone
    lm.generate_until([request(" ".join(f"t{i}" for i in range(30, 45)), 0, until=()), request("t1 t2 t3", 1, until=())])
    lm.session.finish(None)
    out = capsys.readouterr().out
    assert "sets_max@8 is LOSSY by design (max-commit acceptance, opt-in; not checked for losslessness): on task, 1 of 2 " \
           "requests (50.0%)" in out
    samples = {(s["label"], s["doc_id"]): s for s in map(json.loads, (tmp_path / "run" / "samples.jsonl").open())}
    assert samples[("sets_max@8", 0)]["lossy"] and not samples[("sets_max@8", 0)]["lossless"]
    assert samples[("sets_max@8", 0)]["token_divergence"] > 0 and samples[("sets_max@8", 0)]["text"]
    assert all(s["lossless"] and not s["lossy"] for (label, _), s in samples.items() if label != "sets_max@8")
    bundle = read_run(tmp_path / "run")
    assert find_regressions(bundle, None, Tolerances()) == []  # the nightly's divergence check passes it by
    [comparison] = compare(bundle)
    table = comparison.table("threshold")  # SPOT-Sets speculates on threshold decoding: that policy's section
    assert table.loc["SPOT-Sets (max-commit) @8", ("task", "lossless")] == "lossy, 50% differ"
    assert table.loc["SPOT-Sets @8", ("task", "lossless")] in ("✓", "inconclusive")
    assert table.loc["threshold decoding", ("task", "lossless")] == "—"  # the section's reference decoder


def test_a_lossy_methods_own_outputs_are_scored_and_paired_with_draft_free(tmp_path, capsys):
    """GSM8K docs 0 and 1 (answers 18 and 3): draft-free answers 5 and 3, the lossy method 18 and 4."""
    task_dict = TaskManager(include_path=str(TASKS), include_defaults=False).load(["spot_gsm8k"])
    task_dict["tasks"]["spot_gsm8k"].build_all_requests(limit=2, rank=0, world_size=1)

    def method(label: str, text: str, lossy: bool) -> MethodRecord:
        return MethodRecord(label, 8 * lossy, (1, 2), 2, 2, 1.0, 0.9, 0.0, (1, 1), None, lossy=lossy, text=text if lossy else None)

    session = Session(SpotArgs(), {}, NullTracker(), out_dir=tmp_path / "run")
    for doc, (ours, theirs) in enumerate((("#### 5", "#### 18"), ("#### 3", "#### 4"))):
        session.add(RequestRecord("spot_gsm8k", doc, 0, doc, "abc", ours, [method("draft_free", ours, False),
                                                                            method("sets_max", theirs, True)]))
    logged = [{"doc_id": doc, "filter": f, "metrics": ["exact_match"], "exact_match": float(doc == 1)}
              for doc in (0, 1) for f in ("strict-match", "flexible-extract")]
    session.finish({"results": {}, "samples": {"spot_gsm8k": logged}}, task_dict)
    rows = [json.loads(line) for line in (tmp_path / "run" / "outcomes.jsonl").open()]
    assert {(r["doc_id"], r["filter"], r["value"]) for r in rows if r["label"] == "sets_max@8"} == {
        (0, "strict-match", 1.0), (0, "flexible-extract", 1.0), (1, "strict-match", 0.0), (1, "flexible-extract", 0.0)}
    assert "exact_match (strict-match): 0.500 against draft-free's 0.500 on 2 paired samples (1 lost, 1 gained, " \
           "McNemar p = 1)" in capsys.readouterr().out


def test_the_nightly_passes_a_lossy_methods_divergences_and_flags_its_accuracy_drop(tmp_path):
    """Six GSM8K docs, draft-free right on all; sets_max@8 differs on every request and is right on none (p = 2/64)."""
    base = bundle(right=(1,) * 6)
    lossy = pd.DataFrame([{**sample("gsm8k", d, "sets_max@8", 40, 2.0, lossless=False), "lossy": True, "token_divergence": 0.25}
                          for d in range(6)])
    new = replace(base, samples=pd.concat([base.samples, lossy]),
                  outcomes=pd.concat([base.outcomes, base.outcomes.assign(value=0.0, label="sets_max@8")]))
    [finding] = find_regressions(new, None, Tolerances())
    assert finding.kind == "accuracy" and finding.where == "T=0 seed 0 gsm8k exact_match (strict-match) sets_max@8 (lossy) vs draft-free"
    assert "1.000 -> 0.000 on 6 paired samples (6 lost, 0 gained" in finding.detail
    assert find_regressions(new, new, Tolerances()) == [finding]  # against itself nothing else moved
    table = method_table(new, None).set_index("label")
    assert table.loc["sets_max@8", "lossy"] and table.loc["sets_max@8", "token_divergence"] == 0.25 and not table.loc["spot@8", "lossy"]
    [comparison] = compare(new)
    assert comparison.table().loc["SPOT-Sets (max-commit) @8", ("gsm8k", "fwd ×")] == "2.50 [2.50, 2.50]"  # every item alike: a point interval
    assert comparison.table().loc["SPOT-Sets (max-commit) @8", ("gsm8k", "lossless")] == "lossy, 100% differ"
    suite = load_suite(None)
    report = build_report(suite, new, None, "none", [finding], method_table(new, None), pd.DataFrame(), tmp_path, "d1")
    [lossy] = [s for s in report.sections if s.heading.startswith("Lossy methods")]
    assert lossy.tables[0][1].loc[0, ["label", "accuracy", "accuracy_draft_free", "lost"]].tolist() == ["sets_max@8", 0.0, 1.0, 6]
