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
