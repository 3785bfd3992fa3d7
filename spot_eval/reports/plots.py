"""The reports' figures: grouped bars per task and method, accepted-length histograms, trends over nightlies.

Every method has one style in every figure, a function of its label alone: a colour per method family
from the Okabe-Ito palette (distinguishable under the common colour-vision deficiencies) and a hatch
for the larger budget and for budget=auto, so a reader matches bars across figures without a legend
hunt. `overlapping_labels` is what the tests check every figure with: no tick label drawn over another.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: runs headless on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from spot_eval import registry  # noqa: E402
from spot_eval.reports.table2 import ANCHOR, display_name, row_key  # noqa: E402

LARGE_BUDGET = 10  # budgets from here on are hatched: the paper's two budgets per method (8, 20; Spiffy 3, 10) differ


def style(label: str) -> dict:
    """Bar colour and hatch of a method label (`spot@20`, `spot@auto`, `draft_free`)."""
    name, _, budget = label.partition("@")
    hatch = "xx" if budget == "auto" else ("//" if budget.isdigit() and int(budget) >= LARGE_BUDGET else "")
    method = registry.described(name)  # its colour (the built-ins': Okabe & Ito's, one per family) and a variant's hatch
    hatch += method.hatch
    return {"color": method.colour, "hatch": hatch, "edgecolor": "white" if hatch else None}


def _legend_name(label: str, policy: str) -> str:
    return display_name(label, policy) + (f" (over {policy} decoding)" if policy != ANCHOR and label != "draft_free" else "")


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _error_bars(part: pd.DataFrame, column: str):
    """Asymmetric error bars from the 95% interval over the items (`column`_low/_high) where the results hold one,
    else the std over seeds (results before the intervals), else none."""
    mean = part[f"{column}_mean"]
    if f"{column}_low" in part and part[f"{column}_low"].notna().any():
        return [(mean - part[f"{column}_low"]).clip(lower=0).fillna(0.0), (part[f"{column}_high"] - mean).clip(lower=0).fillna(0.0)]
    return part[f"{column}_std"].fillna(0.0) if f"{column}_std" in part else None


def bars_figure(numbers: pd.DataFrame, column: str, ylabel: str, title: str) -> Figure:
    """Tasks on x, one bar per method (a panel per temperature, stacked), error bars = the 95% interval over the items
    (or, for results without one, the std over seeds).

    numbers: long form with temperature, task, label, `column`_mean, `column`_std and optionally policy
    (spot_eval.reports.table2.numbers); the single-commit draft-free rows (all 1.0) are the dashed line."""
    numbers = numbers.assign(policy=numbers.get("policy", ANCHOR))
    # the anchor is the dashed line; a ratio without its reference in the results (NaN) has no bar
    rows = numbers[~((numbers.label == "draft_free") & (numbers.policy == ANCHOR)) & numbers[f"{column}_mean"].notna()]
    temperatures = sorted(rows.temperature.unique())
    tasks = sorted(rows.task.unique())
    series = sorted({(p, lab) for p, lab in zip(rows.policy, rows.label, strict=True)},
                    key=lambda pl: (pl[0] != ANCHOR, pl[0], row_key(pl[1])))
    width = 0.8 / max(len(series), 1)
    fig, axes = plt.subplots(len(temperatures), 1, figsize=(max(7.0, 0.22 * len(tasks) * len(series) + 1.5), 1.0 + 2.8 * len(temperatures)),
                             squeeze=False, sharey=True)
    for ax, temperature in zip(axes[:, 0], temperatures, strict=True):
        here = rows[rows.temperature == temperature]
        for i, (policy, label) in enumerate(series):
            part = here[(here.policy == policy) & (here.label == label)].set_index("task").reindex(tasks)
            x = [t + (i - (len(series) - 1) / 2) * width for t in range(len(tasks))]
            err = _error_bars(part, column)
            ax.bar(x, part[f"{column}_mean"], width=width, yerr=err, capsize=2, label=_legend_name(label, policy),
                   error_kw={"elinewidth": 0.8}, **style(label))
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks(range(len(tasks)), [t.removeprefix("spot_") for t in tasks])
        ax.set_title(f"T = {temperature:g}", fontsize=9)
        ax.set_ylabel(ylabel)
    axes[-1][0].set_xlabel("task")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 4), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.set_layout_engine("constrained")
    return fig


def grouped_bars(numbers: pd.DataFrame, column: str, path: Path, ylabel: str, title: str) -> Path:
    return _save(bars_figure(numbers, column, ylabel, title), path)


def throughput_bars(summary: pd.DataFrame, path: Path) -> Path:
    """One run's throughput ratio per task and method (summary: spot_eval.reports.results.summarize per task)."""
    numbers = summary.assign(temperature=summary.get("temperature", 0.0)).rename(columns={"throughput_ratio": "throughput_mean"})
    return grouped_bars(numbers, "throughput", path, "throughput × over draft-free", "wall-clock speed-up (same requests, same process)")


def forward_bars(summary: pd.DataFrame, path: Path) -> Path:
    """One run's target-forward ratio per task and method (summary: as throughput_bars reads it)."""
    numbers = summary.assign(temperature=summary.get("temperature", 0.0)).rename(columns={"forward_ratio": "forward_mean"})
    return grouped_bars(numbers, "forward", path, "forwards × over draft-free",
                        "target forwards saved (same requests): the hardware-independent saving")


BOUND = "oracle"  # the perfect-order replay: the true future, budget + 1 steps a verify


def frontier_figure(numbers: pd.DataFrame, title: str) -> Figure:
    """Forwards saved against draft nodes verified per forward: a panel per (temperature, policy) and task, a line
    per method family through its budgets, the oracle's (the perfect-order replay bound) as the ceiling. Where a
    trained drafter's line lies above a free one's at the same x, it saved more forwards at equal verify size; error
    bars: the 95% interval over the items.

    numbers: spot_eval.reports.table2.numbers (forward_mean, mean_tree_size per policy, temperature, task, label)."""
    rows = numbers[(numbers.label != "draft_free") & numbers.forward_mean.notna()]
    rows = rows.assign(family=rows.label.str.partition("@")[0], auto=rows.label.str.endswith("@auto"))
    panels = sorted({(t, p) for t, p in zip(rows.temperature, rows.policy, strict=True)},
                    key=lambda tp: (tp[0], tp[1] != ANCHOR, tp[1]))
    tasks = sorted(rows.task.unique())
    fig, axes = plt.subplots(len(panels), len(tasks), figsize=(2.9 * len(tasks) + 1.0, 2.5 * len(panels) + 1.2),
                             squeeze=False, sharex=True)
    for r, (temperature, policy) in enumerate(panels):
        for c, task in enumerate(tasks):
            ax = axes[r][c]
            here = rows[(rows.temperature == temperature) & (rows.policy == policy) & (rows.task == task)]
            for name, line in sorted(here[~here.auto].groupby("family"), key=lambda kv: row_key(kv[0])):
                line = line.sort_values("mean_tree_size")
                bound = name == BOUND
                colour = registry.described(name).colour
                ax.plot(line.mean_tree_size, line.forward_mean, marker="o" if not bound else None, ms=3.5,
                        color=colour, lw=1.6 if bound else 1.2, ls="--" if bound else "-",
                        label=display_name(name) + (" (the bound)" if bound else ""))
                bars = _error_bars(line, "forward")
                if bars is not None and "forward_low" in line:  # the 95% interval over the items at each budget
                    ax.errorbar(line.mean_tree_size, line.forward_mean, yerr=bars, fmt="none", ecolor=colour, elinewidth=0.8,
                                capsize=2)
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
            ax.set_title(f"{task.removeprefix('spot_')}, {policy}, T = {temperature:g}", fontsize=8)
            if c == 0:
                ax.set_ylabel("forwards × over draft-free", fontsize=8)
            if r == len(panels) - 1:
                ax.set_xlabel("draft nodes verified per forward", fontsize=8)
            ax.tick_params(labelsize=7)
    seen: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=min(len(seen), 5), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.set_layout_engine("constrained")
    return fig


def frontier(numbers: pd.DataFrame, path: Path, title: str) -> Path:
    return _save(frontier_figure(numbers, title), path)


PANEL_COLUMNS = 4  # small multiples per row: readable at a report's width, whatever the number of methods


def histogram_figure(frame: pd.DataFrame, title: str) -> Figure:
    """Steps advanced per verify forward, pooled over requests: a small panel per method (frame: one row per request
    with label, policy and accepted_lengths), the share of its forwards that accepted each length, on shared axes."""
    frame = frame.assign(policy=frame.get("policy", ANCHOR))
    labels = sorted({(p, lab) for p, lab in zip(frame.policy, frame.label, strict=True) if lab != "draft_free"} or {(ANCHOR, "draft_free")},
                    key=lambda pl: (pl[0] != ANCHOR, pl[0], row_key(pl[1])))
    counts = {}
    for policy, label in labels:
        lengths = pd.Series([n for row in frame[(frame.policy == policy) & (frame.label == label)].accepted_lengths for n in row])
        counts[(policy, label)] = lengths.value_counts(normalize=True)
    longest = int(max((c.index.max() for c in counts.values() if len(c)), default=1))
    columns = min(PANEL_COLUMNS, len(labels))
    rows = -(-len(labels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(2.9 * columns + 0.6, 1.9 * rows + 0.9), squeeze=False,
                             sharex=True, sharey=True)
    for ax, key in zip(axes.flat, labels, strict=False):
        ax.bar(range(1, longest + 1), counts[key].reindex(range(1, longest + 1), fill_value=0.0), width=0.8, **style(key[1]))
        ax.set_title(_legend_name(key[1], key[0]), fontsize=8)
        ax.tick_params(labelsize=7, labelbottom=True)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in list(axes.flat)[len(labels):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("steps accepted per forward", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("share of forwards", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.set_layout_engine("constrained")
    return fig


def accepted_histogram(frame: pd.DataFrame, path: Path, title: str = "accepted steps per verify forward") -> Path:
    return _save(histogram_figure(frame, title), path)


def trend_figure(series: pd.DataFrame, title: str) -> Figure:
    """A panel per metric, a line per method over the nightlies (series: time, label, throughput_ratio, forward_ratio).
    The nightlies sit at even steps, each named by when it ran: nights a day apart and reruns a minute apart alike."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    nights = sorted(series.time.unique())
    where = {t: i for i, t in enumerate(nights)}
    for ax, column, ylabel in zip(axes, ("throughput_ratio", "forward_ratio"),
                                  ("throughput × over draft-free", "forwards × over draft-free"), strict=True):
        for label, rows in sorted(series.groupby("label"), key=lambda g: row_key(g[0])):
            rows = rows.sort_values("time")
            ax.plot(rows.time.map(where), rows[column], marker="o", color=style(label)["color"],
                    ls="--" if style(label)["hatch"] else "-", label=display_name(label))
        shown = range(0, len(nights), max(1, -(-len(nights) // 6)))  # at most six names
        ax.set_xticks(list(shown), [pd.Timestamp(nights[i]).strftime("%m-%d %H:%M") for i in shown], fontsize=7)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("nightly")
        ax.set_title(ylabel.split(" ×")[0] + " (mean over tasks and temperatures)", fontsize=9)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 5), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.set_layout_engine("constrained")
    return fig


def trend(series: pd.DataFrame, path: Path, title: str = "trend over the last nightlies") -> Path:
    return _save(trend_figure(series, title), path)


def overlapping_labels(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of tick labels (on one axis of one panel) whose drawn boxes overlap, from the renderer's extents."""
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)  # lays the figure out as savefig would
    clashes = []
    for ax in fig.axes:
        for ticks in (ax.get_xticklabels(), ax.get_yticklabels()):
            shown = [(t.get_text(), t.get_window_extent(renderer)) for t in ticks if t.get_visible() and t.get_text()]
            for i, (a, box_a) in enumerate(shown):
                clashes += [(a, b) for b, box_b in shown[i + 1:] if box_a.overlaps(box_b)]
    return clashes
