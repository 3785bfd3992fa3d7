"""What counts as a regression of a nightly against its baseline: pure functions over two bundles.

Four checks, each on what the two runs have in common (same temperature, seed, task, request):
    divergence   any method whose tokens differ from draft-free in the new run;
    accuracy     per task and metric, the paired per-sample outcomes: an exact McNemar test on the
                 samples that flipped (b right -> wrong, c wrong -> right) flags b > c at p < accuracy_p,
                 so one unlucky sample in a small suite is not a regression but a real drop is;
    throughput   a method's throughput ratio (mean over seeds) below baseline * (1 - throughput_drop);
    forwards     a method's summed target forwards above baseline * (1 + forward_rise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from spot_eval.reports.results import Bundle, summarize


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


def divergences(new: Bundle) -> list[Finding]:
    bad = new.samples[~new.samples["lossless"].astype(bool)]
    out = []
    for (temperature, seed, task, label), rows in bad.groupby(["temperature", "seed", "task", "label"], sort=True):
        first = rows.iloc[0]
        out.append(Finding("divergence", f"{_t(temperature)} seed {seed} {task} {label}",
                           f"{len(rows)} request(s) differ from draft-free, first doc {first['doc_id']} "
                           f"({describe(first.get('divergence') or {})})"))
    return out


def accuracy_changes(new: Bundle, base: Bundle, p_max: float) -> tuple[list[Finding], pd.DataFrame]:
    """Findings, and the paired table (per temperature, seed, task, filter, metric)."""
    keys = ["temperature", "seed", "task", "filter", "metric"]
    if new.outcomes.empty or base.outcomes.empty:
        return [], pd.DataFrame()
    both = new.outcomes.merge(base.outcomes, on=[*keys, "doc_id"], suffixes=("", "_base"))
    rows, findings = [], []
    for key, g in both.groupby(keys, sort=True, dropna=False):
        right, right_base = g["value"] > 0.5, g["value_base"] > 0.5
        b, c = int((right_base & ~right).sum()), int((~right_base & right).sum())
        p = mcnemar_p(b, c)
        row = dict(zip(keys, key, strict=True)) | {
            "samples": len(g), "accuracy": right.mean(), "accuracy_base": right_base.mean(), "lost": b, "gained": c, "p": p,
        }
        rows.append(row)
        if b > c and p < p_max:
            metric = f"{row['metric']}" + (f" ({row['filter']})" if row["filter"] not in (None, "none") else "")
            findings.append(Finding("accuracy", f"{_t(row['temperature'])} seed {row['seed']} {row['task']} {metric}",
                                    f"{row['accuracy_base']:.3f} -> {row['accuracy']:.3f} on {len(g)} paired samples "
                                    f"({b} lost, {c} gained, McNemar p = {p:.3g})"))
    return findings, pd.DataFrame(rows)


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
    return summary.groupby(["temperature", "task", "label"], sort=False).agg(
        throughput_ratio=("throughput_ratio", "mean"), throughput_std=("throughput_ratio", "std"),
        forward_ratio=("forward_ratio", "mean"), forwards=("forwards", "sum"),
        lossless=("lossless", "mean"), accepted_mean=("accepted_mean", "mean"), drafter_share=("drafter_share", "mean"),
        seeds=("seconds", "size"),
    ).reset_index()


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
    """Every regression of `new` (divergences need no baseline)."""
    findings = divergences(new)
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
