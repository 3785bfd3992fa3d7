"""`spot-eval compare`: the SPOT paper's Table 2 layout from MLflow runs or results files.

Rows are tasks; columns are the methods present (Spiffy, SPOT, SPOT-gamma first, then any other),
one column per method and budget. A cell is the throughput ratio over draft-free decoding, mean
over seeds ± std, with the best of its row in bold and a mark for losslessness (every request of
the cell token-identical to draft-free, or the lossless fraction). A second table does the same
for target-forward ratios, and a third gives the mean tree size (draft nodes per verify forward), which
budget=auto chooses step by step. A lossy method (max-commit, opt-in) is marked "lossy" with the share of
its requests whose output differs from draft-free, never ✓ or ✗: it differs by design. One set of tables per temperature; the caption states the target,
block length, generation length, budgets, temperature and seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spot_eval.reports import plots
from spot_eval.reports.report import Report, Section, write
from spot_eval.reports.results import Bundle, summarize

METHOD_ORDER = ("spiffy", "spot", "spot_gamma")
DISPLAY = {"spiffy": "Spiffy", "spot": "SPOT", "spot_gamma": "SPOT-γ"}
LOSSLESS, LOSSY = "✓", "✗"
BY_DESIGN = "lossy"  # the mark of a method that differs from draft-free by design (max-commit)


@dataclass(frozen=True)
class Comparison:
    temperature: float
    caption: str
    throughput: pd.DataFrame  # display table: tasks x methods, strings
    forwards: pd.DataFrame
    tree_sizes: pd.DataFrame
    numbers: pd.DataFrame  # long form: task, label, metric, mean, std, seeds, lossless


AUTO_LAST = 10**9  # budget=auto's column after every fixed budget of its method


def _column(label: str) -> tuple[int, int, str]:
    name, _, budget = label.partition("@")
    rank = METHOD_ORDER.index(name) if name in METHOD_ORDER else len(METHOD_ORDER)
    return rank, AUTO_LAST if budget == "auto" else int(budget or 0), label


def display_name(label: str) -> str:
    name, _, budget = label.partition("@")
    return f"{DISPLAY.get(name, name)} @{budget}" if budget else DISPLAY.get(name, name)


def long_form(bundle: Bundle) -> pd.DataFrame:
    """Per temperature, task and method: mean and std over seeds of both ratios, and losslessness."""
    per_seed = summarize(bundle.samples, ["temperature", "seed", "task"])
    per_seed = per_seed[per_seed.label != "draft_free"]
    return per_seed.groupby(["temperature", "task", "label"], sort=True).agg(
        throughput_mean=("throughput_ratio", "mean"), throughput_std=("throughput_ratio", "std"),
        forward_mean=("forward_ratio", "mean"), forward_std=("forward_ratio", "std"),
        tree_mean=("mean_tree_size", "mean"), tree_std=("mean_tree_size", "std"),
        lossless=("lossless", "mean"), lossy=("lossy", "max"), seeds=("seed", "nunique"), requests=("requests", "sum"),
    ).reset_index()


def _cells(numbers: pd.DataFrame, metric: str, best_bold: bool = True) -> pd.DataFrame:
    labels = sorted(numbers.label.unique(), key=_column)
    table = {}
    for task, rows in numbers.groupby("task", sort=True):
        rows = rows.set_index("label")
        best = rows[f"{metric}_mean"].max()
        line = {}
        for label in labels:
            if label not in rows.index:
                line[display_name(label)] = "—"
                continue
            r = rows.loc[label]
            text = f"{r[f'{metric}_mean']:.2f}" + (f" ± {r[f'{metric}_std']:.2f}" if r["seeds"] > 1 else "")
            if best_bold and r[f"{metric}_mean"] == best:
                text = f"**{text}**"
            if r["lossy"]:
                mark = f"{BY_DESIGN}, {1 - r['lossless']:.0%} differ"
            else:
                mark = LOSSLESS if r["lossless"] == 1.0 else f"{LOSSY} {r['lossless']:.0%}"
            line[display_name(label)] = f"{text} {mark}"
        table[task] = line
    out = pd.DataFrame.from_dict(table, orient="index")
    out.index.name = "task"
    return out.reset_index()


def compare(bundle: Bundle) -> list[Comparison]:
    numbers = long_form(bundle)
    if numbers.empty:
        raise ValueError("the results hold no speculative method, only draft-free decoding; run with methods=...")
    out = []
    for temperature, rows in numbers.groupby("temperature", sort=True):
        seeds = sorted(bundle.samples[bundle.samples.temperature == temperature].seed.unique())
        s = bundle.settings
        budgets = ", ".join(display_name(lab) for lab in sorted(rows.label.unique(), key=_column))
        caption = (f"Target {s.get('target')}, block {s.get('block_length')}, generation length {s.get('gen_length')}, "
                   f"T = {temperature:g}, seeds {', '.join(map(str, seeds))}; methods and budgets: {budgets}. "
                   f"Ratios over draft-free decoding of the same requests in the same process (mean ± std over seeds); "
                   f"best per task in bold; {LOSSLESS} = every output token-identical to draft-free; {BY_DESIGN} = max-commit, "
                   "whose outputs differ from draft-free by design (the share of requests that differ).")
        out.append(Comparison(float(temperature), caption, _cells(rows, "throughput"), _cells(rows, "forward"),
                              _cells(rows, "tree", best_bold=False), rows))
    return out


def write_comparison(bundle: Bundle, out_dir: str | Path) -> list[Path]:
    """compare.md / compare.html, one CSV per temperature (long form), one grouped bar chart per temperature."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sections, files = [], []
    for c in compare(bundle):
        tag = f"T{c.temperature:g}"
        csv = out_dir / f"compare_{tag}.csv"
        c.numbers.to_csv(csv, index=False)
        means = c.numbers.pivot(index="task", columns="label", values="throughput_mean")
        stds = c.numbers.pivot(index="task", columns="label", values="throughput_std")
        order = sorted(means.columns, key=_column)
        means, stds = means[order].rename(columns=display_name), stds[order].rename(columns=display_name)
        chart = plots.grouped_bars(means, stds, out_dir / f"compare_{tag}.png", "throughput ratio vs draft-free", f"T = {c.temperature:g}")
        files += [csv, chart]
        sections.append(Section(
            f"T = {c.temperature:g}", c.caption,
            tables=(("Throughput ratio over draft-free", c.throughput), ("Target-forward ratio over draft-free", c.forwards),
                    ("Mean tree size (draft nodes per verify forward)", c.tree_sizes)),
            figures=(("throughput ratio per task and method (error bars: std over seeds)", chart),),
        ))
    report = Report("SPOT vs Spiffy", "Table 2 layout of the SPOT paper (arXiv 2610.22543), measured by spot-eval.", sections)
    files += list(write(report, out_dir, "compare"))
    return files
