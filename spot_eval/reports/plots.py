"""Plots of a run's summary: throughput ratio per task and method, and accepted-length histograms."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: runs headless on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def throughput_bars(summary: pd.DataFrame, path: Path) -> Path:
    """Grouped bars: tasks on x, one bar per method, height = throughput ratio vs draft-free."""
    table = summary[summary.label != "draft_free"].pivot(index="task", columns="label", values="throughput_ratio")
    ax = table.plot.bar(figsize=(max(4, 1.5 * len(table)), 3.5), rot=0)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_ylabel("throughput ratio vs draft-free")
    ax.set_title("wall-clock speed-up (same requests, same process)")
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=120)
    plt.close(ax.figure)
    return path


def accepted_histogram(frame: pd.DataFrame, path: Path) -> Path:
    """Steps advanced per verify forward, pooled over requests, one panel per method."""
    methods = [m for m in frame.label.unique() if m != "draft_free"] or ["draft_free"]
    fig, axes = plt.subplots(1, len(methods), figsize=(3.2 * len(methods), 2.8), squeeze=False)
    for ax, label in zip(axes[0], methods, strict=True):
        lengths = [n for row in frame[frame.label == label].accepted_lengths for n in row]
        ax.hist(lengths, bins=range(1, max(lengths, default=1) + 2), align="left", rwidth=0.85)
        ax.set_title(label)
        ax.set_xlabel("accepted steps per forward")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def against_baseline(table: pd.DataFrame, column: str, path: Path, ylabel: str) -> Path:
    """Bars per task and method: this run's `column` beside the baseline's (`column`_base), per temperature."""
    rows = table[table.label != "draft_free"]
    temperatures = sorted(rows.temperature.unique())
    fig, axes = plt.subplots(1, len(temperatures), figsize=(5.5 * len(temperatures), 3.6), squeeze=False)
    for ax, temperature in zip(axes[0], temperatures, strict=True):
        part = rows[rows.temperature == temperature]
        names = [f"{t}\n{m}" for t, m in zip(part.task, part.label, strict=True)]
        x = range(len(part))
        ax.bar([i - 0.2 for i in x], part[column], width=0.4, label="this run")
        if f"{column}_base" in part:
            ax.bar([i + 0.2 for i in x], part[f"{column}_base"], width=0.4, label="baseline", alpha=0.6)
        ax.set_xticks(list(x), names, rotation=60, ha="right", fontsize=7)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(f"T = {temperature:g}")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def trend(series: pd.DataFrame, path: Path) -> Path:
    """Lines over nightlies: series has columns time, label, throughput_ratio, forward_ratio."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, column in zip(axes, ("throughput_ratio", "forward_ratio"), strict=True):
        for label, rows in series.groupby("label", sort=True):
            rows = rows.sort_values("time")
            ax.plot(rows.time, rows[column], marker="o", label=label)
        ax.set_title(column.replace("_", " ") + " (mean over tasks and temperatures)")
        ax.tick_params(axis="x", rotation=30, labelsize=7)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def grouped_bars(means: pd.DataFrame, stds: pd.DataFrame, path: Path, ylabel: str, title: str) -> Path:
    """Tasks on x, one bar per method with its std over seeds as an error bar."""
    ax = means.plot.bar(yerr=stds.fillna(0.0), figsize=(max(5, 1.8 * len(means)), 3.8), rot=0, capsize=2)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=120)
    plt.close(ax.figure)
    return path
