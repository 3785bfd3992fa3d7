"""`spot-eval compare`: the SPOT paper's Table 2 from MLflow runs or results files, as a self-contained report.

Per temperature, Table 2 (spot_eval/reports/table2.py): a row per method, a column group per task,
one section per decoding policy (SPOT-Sets against threshold decoding under the single-commit anchor).
Then grouped bars of the throughput and forward ratios (tasks on x, a bar per method, error bars over
seeds), the accepted-steps histogram, and accuracy per task and method. The caption states the target,
block length, generation length, temperature and seeds; the header, what ran (dtype, device, versions, commit).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spot_eval.reports import plots, table2
from spot_eval.reports.report import Report, Section, figure_title, header, write
from spot_eval.reports.results import Bundle

SECTION_TITLES = {table2.ANCHOR: "single-commit decoding: ratios over draft-free decoding of the same requests"}


def section_title(policy: str) -> str:
    return SECTION_TITLES.get(policy, f"speculation on {policy} decoding: ratios over {policy} decoding of the same requests "
                                      f"(its own row: over the single-commit anchor, whose seconds were timed in another process)")


@dataclass(frozen=True)
class Comparison:
    temperature: float
    caption: str
    sections: list[tuple[str, pd.DataFrame]]  # (policy, Table 2 display table)
    numbers: pd.DataFrame  # long form (table2.numbers) at this temperature

    def table(self, policy: str = table2.ANCHOR) -> pd.DataFrame:
        return dict(self.sections)[policy]


def caption(bundle: Bundle, temperature: float) -> str:
    seeds = sorted(bundle.samples[bundle.samples.temperature == temperature].seed.unique())
    s = bundle.settings
    return (f"Target {s.get('target')}, block {s.get('block_length')}, generation length {s.get('gen_length')}, "
            f"T = {temperature:g}, seeds {', '.join(map(str, seeds))}. tput × and fwd ×: throughput and target-forward ratios over the reference decoder on the same "
            f"requests, each request's methods decoded back to back in one process (mean ± std over seeds); τ: decoding "
            f"steps accepted per target forward (1.00 for a draft-free decoder); acc.: lm-eval's first metric "
            f"of the task, the same for every lossless method; best speculative cell per column in bold. "
            f"{table2.LOSSLESS} = every output token-identical to draft-free with drafts accepted; {table2.INCONCLUSIVE} = "
            f"identical, but no draft was ever accepted; {table2.DIVERGED} = the share identical; {table2.BY_DESIGN} = "
            "max-commit, which differs from draft-free by design.")


def compare(bundle: Bundle) -> list[Comparison]:
    numbers = table2.numbers(bundle)
    if not (numbers.label != "draft_free").any():
        raise ValueError("the results hold no speculative method, only draft-free decoding; run with methods=...")
    return [Comparison(float(t), caption(bundle, t), table2.sections(numbers, t), rows)
            for t, rows in numbers.groupby("temperature", sort=True)]


def accuracy_table(bundle: Bundle) -> pd.DataFrame:
    """lm-eval's accuracy metrics only (no sample_len), per task, decoding policy, metric and temperature: mean over seeds."""
    acc = table2.accuracy_metrics(bundle)
    if acc.empty:
        return acc
    return acc.pivot_table(index=["task", "policy", "metric"], columns="temperature", values="value", aggfunc="mean").rename(
        columns=lambda t: f"T = {t:g}").reset_index()


def figures(bundle: Bundle, numbers: pd.DataFrame, out_dir: Path, date: str, stem: str) -> list[tuple[str, Path]]:
    """The grouped throughput and forward bars and the accepted-steps histogram of a bundle."""
    who = bundle.identity
    return [
        ("throughput × over draft-free per task and method (error bars: std over seeds)",
         plots.grouped_bars(numbers, "throughput", out_dir / f"{stem}throughput_ratio.png", "throughput × over draft-free",
                            figure_title("wall-clock speed-up over draft-free decoding", who, date))),
        ("target forwards × over draft-free per task and method (error bars: std over seeds)",
         plots.grouped_bars(numbers, "forward", out_dir / f"{stem}forward_ratio.png", "forwards × over draft-free",
                            figure_title("target forwards saved over draft-free decoding", who, date))),
        ("steps accepted per target forward, per method (all tasks, temperatures and seeds)",
         plots.accepted_histogram(bundle.samples, out_dir / f"{stem}accepted_lengths.png",
                                  figure_title("accepted steps per target forward", who, date))),
    ]


def write_comparison(bundle: Bundle, out_dir: str | Path, date: str | None = None) -> list[Path]:
    """compare.md / compare.html, one CSV per temperature (long form) and the figures."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    comparisons = compare(bundle)
    files, sections = [], []
    for c in comparisons:
        csv = out_dir / f"compare_T{c.temperature:g}.csv"
        c.numbers.to_csv(csv, index=False)
        files.append(csv)
        sections.append(Section(f"Table 2 at T = {c.temperature:g}", c.caption,
                                tables=tuple((section_title(policy), table) for policy, table in c.sections)))
    date = date or (bundle.created or "")[:10]
    numbers = pd.concat([c.numbers for c in comparisons], ignore_index=True)
    shown = figures(bundle, numbers, out_dir, date, "compare_")
    files += [path for _, path in shown]
    sections.append(Section("Speed per task and method", figures=tuple(shown[:2])))
    sections.append(Section("Accepted steps per forward", figures=(shown[2],)))
    accuracy = accuracy_table(bundle)
    if not accuracy.empty:
        sections.append(Section("Accuracy", "lm-eval's scores of the draft-free text of each decoding policy (mean over seeds); "
                                            "every lossless method's outputs are the same text.", tables=(("accuracy per task", accuracy),)))
    lead = (f"The SPOT paper's Table 2 (arXiv 2610.22543), measured by spot-eval on {bundle.settings.get('target')}: "
            f"{len(bundle.samples.drop_duplicates(['temperature', 'seed', 'task', 'doc_id']))} requests in {len(bundle.runs)} run(s).")
    report = Report("SPOT, SPOT-Sets and Spiffy against draft-free decoding", lead, sections,
                    header(bundle.identity, date=date))
    files += list(write(report, out_dir, "compare"))
    return files
