"""What counts as a regression of a nightly against its baseline: pure functions over two bundles.

Four checks, each on what the two runs have in common (same temperature, seed, task, request):
    divergence   any lossless method whose tokens differ from draft-free in the new run (a lossy
                 method, max-commit, differs by design: its divergence rate is reported instead);
    accuracy     per task and metric, the paired per-sample outcomes: an exact McNemar test on the
                 samples that flipped (b right -> wrong, c wrong -> right) flags b > c at p < accuracy_p,
                 so one unlucky sample in a small suite is not a regression but a real drop is; the same
                 test sets each lossy method's own outputs against draft-free's in the new run;
    throughput   a method's throughput ratio (mean over seeds) below baseline * (1 - throughput_drop);
    forwards     a method's summed target forwards above baseline * (1 + forward_rise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from spot_eval.reports.results import Bundle, over_seeds, summarize


@dataclass(frozen=True)
class Tolerances:
    throughput_drop: float = 0.15  # relative; wall-clock ratios move a few percent between identical runs
    forward_rise: float = 0.0  # relative; forwards are deterministic at a fixed seed
    accuracy_p: float = 0.05

    def __post_init__(self) -> None:
        if not (0 <= self.throughput_drop < 1 and self.forward_rise >= 0 and 0 < self.accuracy_p <= 1):
            raise ValueError(
                f"tolerances out of range: throughput_drop in [0, 1), forward_rise >= 0, accuracy_p in (0, 1]; got {self}"
            )


@dataclass(frozen=True)
class Finding:
    kind: str  # divergence | accuracy | throughput | forwards
    where: str  # e.g. "T=0 spot_gsm8k spot@8"
    detail: str


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for b and c discordant pairs."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def _t(temperature: float) -> str:
    return f"T={temperature:g}"


def _divergent(samples: pd.DataFrame) -> pd.DataFrame:
    """The requests of lossless methods whose tokens differ from draft-free (a lossy method differs by design)."""
    lossy = samples["lossy"].eq(True) if "lossy" in samples.columns else False
    return samples[~samples["lossless"].astype(bool) & ~lossy]


def divergences(new: Bundle) -> list[Finding]:
    bad = _divergent(new.samples)
    out = []
    for (temperature, seed, task, label), rows in bad.groupby(["temperature", "seed", "task", "label"], sort=True):
        first = rows.iloc[0]
        out.append(Finding("divergence", f"{_t(temperature)} seed {seed} {task} {label}",
                           f"{len(rows)} request(s) differ from draft-free, first doc {first['doc_id']} "
                           f"({describe(first.get('divergence') or {})})"))
    return out


def labelled(outcomes: pd.DataFrame) -> pd.DataFrame:
    """Outcomes with their method: lm-eval's own rows score the draft-free text (runs written before lossy
    methods were rescored carry no label)."""
    if outcomes.empty:
        return outcomes
    label = outcomes["label"].fillna("draft_free") if "label" in outcomes.columns else "draft_free"
    return outcomes.assign(label=label)


def _paired(both: pd.DataFrame, keys: list[str], suffix: str) -> pd.DataFrame:
    """Per keys, the exact McNemar test of `value` against `value{suffix}` on the same samples (> 0.5 is right)."""
    rows = []
    for key, g in both.groupby(keys, sort=True, dropna=False):
        right, right_other = g["value"] > 0.5, g[f"value{suffix}"] > 0.5
        b, c = int((right_other & ~right).sum()), int((~right_other & right).sum())
        rows.append(dict(zip(keys, key, strict=True)) | {
            "samples": len(g), "accuracy": right.mean(), f"accuracy{suffix}": right_other.mean(), "lost": b, "gained": c,
            "p": mcnemar_p(b, c),
        })
    return pd.DataFrame(rows)


def _metric(row) -> str:
    return f"{row['metric']}" + (f" ({row['filter']})" if row["filter"] not in (None, "none") else "")


def accuracy_changes(new: Bundle, base: Bundle, p_max: float) -> tuple[list[Finding], pd.DataFrame]:
    """Findings, and the paired table (per temperature, seed, task, filter, metric and scored method)."""
    keys = ["temperature", "seed", "task", "filter", "metric", "label"]
    if new.outcomes.empty or base.outcomes.empty:
        return [], pd.DataFrame()
    both = labelled(new.outcomes).merge(labelled(base.outcomes), on=[*keys, "doc_id"], suffixes=("", "_base"))
    table = _paired(both, keys, "_base")
    findings = []
    for _, row in table.iterrows():
        if row["lost"] > row["gained"] and row["p"] < p_max:
            method = "" if row["label"] == "draft_free" else f" {row['label']}"
            findings.append(Finding("accuracy", f"{_t(row['temperature'])} seed {row['seed']} {row['task']} {_metric(row)}{method}",
                                    f"{row['accuracy_base']:.3f} -> {row['accuracy']:.3f} on {row['samples']} paired samples "
                                    f"({row['lost']} lost, {row['gained']} gained, McNemar p = {row['p']:.3g})"))
    return findings, table


def lossy_accuracy(outcomes: pd.DataFrame) -> pd.DataFrame:
    """Each lossy method's own outputs against draft-free's on the same samples, per (temperature, seed,) task,
    filter and metric: accuracy, accuracy_draft_free, lost (right in draft-free, wrong in the method), gained,
    McNemar p. Empty without per-sample outcomes of both."""
    outcomes = labelled(outcomes)
    if outcomes.empty:
        return pd.DataFrame()
    keys = [k for k in ("temperature", "seed", "task", "filter", "metric") if k in outcomes.columns]
    draft_free = outcomes[outcomes.label == "draft_free"].drop(columns="label")
    both = outcomes[outcomes.label != "draft_free"].merge(draft_free, on=[*keys, "doc_id"], suffixes=("", "_draft_free"))
    return _paired(both, ["label", *keys], "_draft_free") if not both.empty else pd.DataFrame()


def lossy_accuracy_drops(new: Bundle, p_max: float) -> list[Finding]:
    """A lossy method whose outputs score below draft-free's beyond noise (the paired test of `accuracy_changes`)."""
    findings = []
    for _, row in lossy_accuracy(new.outcomes).iterrows():
        if row["lost"] > row["gained"] and row["p"] < p_max:
            findings.append(Finding("accuracy", f"{_t(row['temperature'])} seed {row['seed']} {row['task']} {_metric(row)} "
                                                f"{row['label']} (lossy) vs draft-free",
                                    f"{row['accuracy_draft_free']:.3f} -> {row['accuracy']:.3f} on {row['samples']} paired samples "
                                    f"({row['lost']} lost, {row['gained']} gained, McNemar p = {row['p']:.3g})"))
    return findings


def method_table(new: Bundle, base: Bundle | None) -> pd.DataFrame:
    """Per temperature, task and method: ratios (mean over seeds) and forwards on the shared requests."""
    keys = ["temperature", "seed", "task", "doc_id", "repeat", "label"]
    samples_new = new.samples
    samples_base = None
    if base is not None:
        shared = new.samples[keys].merge(base.samples[keys], on=keys)
        if not shared.empty:  # no shared requests (another temperature, say): nothing to compare against
            samples_new = new.samples.merge(shared, on=keys)
            samples_base = base.samples.merge(shared, on=keys)
    table = _per_method(summarize(samples_new, ["temperature", "seed", "task"]))
    if samples_base is not None and not samples_base.empty:
        old = _per_method(summarize(samples_base, ["temperature", "seed", "task"]))
        table = table.merge(old, on=["temperature", "task", "label"], how="left", suffixes=("", "_base"))
    return table


def _per_method(summary: pd.DataFrame) -> pd.DataFrame:
    """Over the seeds (spot_eval.reports.results.over_seeds), under the nightly's names for the ratios' means."""
    table = over_seeds(summary, ["temperature", "task"]).rename(columns={"throughput_mean": "throughput_ratio",
                                                                          "forward_mean": "forward_ratio"})
    return table[["temperature", "task", "label", "throughput_ratio", "throughput_std", "forward_ratio", "forwards", "lossless",
                  "lossy", "token_divergence", "accepted_mean", "drafter_share", "seeds"]]


def performance_changes(table: pd.DataFrame, tolerances: Tolerances) -> list[Finding]:
    if "forwards_base" not in table.columns:
        return []
    out = []
    for _, r in table.iterrows():
        where = f"{_t(r['temperature'])} {r['task']} {r['label']}"
        if pd.notna(r["forwards_base"]) and r["forwards"] > r["forwards_base"] * (1 + tolerances.forward_rise):
            out.append(Finding("forwards", where, f"target forwards {int(r['forwards_base'])} -> {int(r['forwards'])} "
                                                  f"(+{r['forwards'] / r['forwards_base'] - 1:.1%}, tolerance {tolerances.forward_rise:.0%})"))
        if r["label"] == "draft_free" or pd.isna(r["throughput_ratio_base"]):
            continue
        if r["throughput_ratio"] < r["throughput_ratio_base"] * (1 - tolerances.throughput_drop):
            out.append(Finding("throughput", where, f"throughput ratio {r['throughput_ratio_base']:.2f}x -> "
                                                    f"{r['throughput_ratio']:.2f}x ({r['throughput_ratio'] / r['throughput_ratio_base'] - 1:+.1%}, "
                                                    f"tolerance -{tolerances.throughput_drop:.0%})"))
    return out


def find_regressions(new: Bundle, base: Bundle | None, tolerances: Tolerances) -> list[Finding]:
    """Every regression of `new` (divergences and lossy methods' accuracy against draft-free need no baseline)."""
    findings = divergences(new) + lossy_accuracy_drops(new, tolerances.accuracy_p)
    if base is None:
        return findings
    findings += accuracy_changes(new, base, tolerances.accuracy_p)[0]
    findings += performance_changes(method_table(new, base), tolerances)
    return findings


def describe(divergence: dict) -> str:
    """One line for a divergence (a samples.jsonl row's `divergence`): where, which decision flipped, and how near it was."""
    text = f"first divergent token {divergence.get('index')}"
    if divergence.get("flipped") is None or divergence.get("margin") is None:
        return text
    margins = ", ".join(f"{k} {v:.3g}" for k, v in (divergence.get("margins") or {}).items() if v is not None)
    return (f"{text}; block {divergence['block']} step {divergence['step']}: the {divergence['flipped']} decision "
            f"flipped (margin {divergence['margin']:.3g}; the step's margins: {margins})")


def gates(table: pd.DataFrame, new: Bundle, base: Bundle | None, findings: list[Finding], tolerances: Tolerances) -> pd.DataFrame:
    """The verdict table: per regression gate, its threshold, tonight's value, the baseline's, and PASS / FAIL
    (n/a for a gate that needs a baseline when there is none). `table` is `method_table(new, base)`."""
    failed = {f.kind for f in findings}
    speculative = table[table.label != "draft_free"]

    def divergent(bundle: Bundle) -> str:
        samples = bundle.samples[bundle.samples.label != "draft_free"]
        checked = samples[~samples["lossy"].eq(True)] if "lossy" in samples.columns else samples
        return f"{len(_divergent(checked))} of {len(checked)} requests"

    def mean(column: str, fmt: str) -> str:
        values = speculative[column].dropna() if column in speculative else pd.Series(dtype=float)
        return format(values.mean(), fmt) if len(values) else "—"

    def scored(bundle: Bundle | None) -> str:
        outcomes = labelled(bundle.outcomes) if bundle is not None else pd.DataFrame()
        own = outcomes[outcomes.label == "draft_free"] if not outcomes.empty else outcomes
        return f"{(own['value'] > 0.5).mean():.3f} right ({len(own)} scores)" if len(own) else "—"

    def status(kind: str, needs_base: bool = True) -> str:
        if kind in failed:
            return "FAIL"
        return "n/a" if needs_base and base is None else "PASS"

    rows = [
        ("lossless: every lossless method's tokens equal draft-free's", "0 divergent requests", divergent(new),
         divergent(base) if base is not None else "—", status("divergence", needs_base=False)),
        ("throughput ratio per task and method (mean over seeds)", f"≥ previous × {1 - tolerances.throughput_drop:.2f}",
         mean("throughput_ratio", ".3f") + "× mean", mean("throughput_ratio_base", ".3f") + "× mean" if base is not None else "—",
         status("throughput")),
        ("target forwards per task and method", f"≤ previous × {1 + tolerances.forward_rise:.2f}",
         f"{int(table.forwards.sum())} in all", f"{int(table.forwards_base.sum())} in all" if "forwards_base" in table else "—",
         status("forwards")),
        ("accuracy per task and metric (paired per sample)", f"no drop at McNemar p < {tolerances.accuracy_p:g}",
         scored(new), scored(base), status("accuracy", needs_base=not lossy_accuracy(new.outcomes).shape[0])),
    ]
    return pd.DataFrame(rows, columns=["gate", "threshold", "tonight", "previous", "verdict"])


def divergence_table(new: Bundle) -> pd.DataFrame:
    """Every divergent request of a lossless method: where its tokens first differ and the decision that flipped."""
    bad = _divergent(new.samples)
    return pd.DataFrame([{"temperature": r.temperature, "seed": r.seed, "task": r.task, "doc_id": r.doc_id, "method": r.label,
                          "divergence": describe(r.get("divergence") or {})} for _, r in bad.iterrows()])
