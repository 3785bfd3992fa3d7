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
from spot_eval.reports.results import WANTED_HALF_WIDTH, Bundle, items_needed, mean_interval, ratio_replicates
from spot_eval.reports.table2 import display_name, shown_ratio

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
            f"of the task, the same for every lossless method; the best speculative cell per column in bold where it beats "
            f"draft-free. "
            f"{table2.LOSSLESS} = every output token-identical to draft-free with drafts accepted; {table2.INCONCLUSIVE} = "
            f"identical, but no draft was ever accepted; {table2.DIVERGED} = the share identical; {table2.BY_DESIGN} = "
            "max-commit, which differs from draft-free by design.")


# The trained drafter each policy is measured with against the training-free chain (FreeDave; FreeDave++ under
# threshold decoding), and the perfect-order replay that bounds them all.
TRAINED = {"single": "spot", "threshold": "sets"}
FREE, BOUND = "freedave", "oracle"


def rivals(numbers: pd.DataFrame) -> pd.DataFrame:
    """Per temperature, policy, task and fixed budget N: each method at N, its forward ratio, draft nodes per
    forward and, where the oracle ran at N too, its share of the bound, (ratio - 1) / (oracle's - 1): the forwards a
    perfect drafter of N nodes would save that this one saved (NaN without the oracle)."""
    at = numbers.assign(family=numbers.label.str.partition("@")[0], budget=numbers.label.str.partition("@")[2])
    at = at[at.budget.str.isdigit()]
    out = []
    for (t, policy, task), group in at.groupby(["temperature", "policy", "task"], sort=False):
        bound = {r.budget: r.forward_mean for r in group[group.family == BOUND].itertuples()}
        for r in group[group.family != BOUND].itertuples():
            ceiling = bound.get(r.budget, float("nan"))
            out.append({"temperature": t, "policy": policy, "task": task, "label": r.label, "budget": int(r.budget),
                        "forward_mean": r.forward_mean, "mean_tree_size": r.mean_tree_size, "bound": ceiling,
                        "share_of_bound": (r.forward_mean - 1) / (ceiling - 1),
                        "forward_low": getattr(r, "forward_low", float("nan")),
                        "forward_high": getattr(r, "forward_high", float("nan"))})
    return pd.DataFrame(out)


def overlap(a: pd.Series, b: pd.Series) -> bool:
    """Whether two cells' 95% intervals of the forward ratio overlap, so that the interval cannot tell which of the
    two saves more (cells without intervals: never)."""
    if pd.isna(a.forward_low) or pd.isna(b.forward_low):
        return False
    return bool(a.forward_low <= b.forward_high and b.forward_low <= a.forward_high)


def leaders_at(table: pd.DataFrame, budget: int) -> list[str]:
    """In words, per temperature and policy, each task's method that saves the most forwards at `budget` drafted
    states a verify, with its interval and share of the bound; where the runner-up's interval overlaps its, the
    interval cannot tell them apart, and both are named."""
    lines = []
    at = table[table.budget == budget] if not table.empty else table
    for (t, policy), group in at.groupby(["temperature", "policy"], sort=True):
        said = []
        for task, rows in group.groupby("task", sort=True):
            ranked = rows.sort_values("forward_mean", ascending=False)
            top = ranked.iloc[0]
            share = "" if pd.isna(top.share_of_bound) else f", {top.share_of_bound:.0%} of the bound"
            cell = f"{display_name(top.label)} {shown_ratio(top.forward_mean, top.forward_low, top.forward_high)}{share}"
            tied = [r for _, r in ranked.iloc[1:].iterrows() if overlap(top, r)]
            name = task.removeprefix("spot_")
            said.append(f"{name}: {cell}" if not tied else
                        f"{name}: the interval cannot tell {cell} from " + ", ".join(
                            f"{display_name(r.label)} {shown_ratio(r.forward_mean, r.forward_low, r.forward_high)}" for r in tied))
        lines.append(f"T = {t:g}, {policy} decoding, {budget} drafted states a verify, the most forwards saved per task: "
                     + "; ".join(said) + ".")
    return lines


def rival_verdicts(table: pd.DataFrame) -> list[str]:
    """In words, per temperature, policy and budget: the trained drafter against the FreeDave chain, task by task,
    with every task where the free one saved more forwards named plainly."""
    lines = []
    if table.empty:
        return lines
    for (t, policy, n), group in table.groupby(["temperature", "policy", "budget"], sort=True):
        cell = group.set_index(["task", "label"]).forward_mean
        trained, free = f"{TRAINED.get(policy, '')}@{n}", f"{FREE}@{n}"
        tasks = sorted({task for task, label in cell.index if label == free} & {task for task, label in cell.index if label == trained})
        if not tasks:
            continue
        rows = group.set_index(["task", "label"])
        unclear = [task for task in tasks if overlap(rows.loc[(task, free)], rows.loc[(task, trained)])]
        behind = [task for task in tasks if cell[(task, free)] > cell[(task, trained)] and task not in unclear]
        ahead = len(tasks) - len(behind) - len(unclear)
        share = group.groupby("label").share_of_bound.mean()
        said = (f"T = {t:g}, {policy} decoding, {n} drafted states a verify: {display_name(trained)} saved more target "
                f"forwards than {display_name(free)} on {ahead} of {len(tasks)} tasks")
        if unclear:
            said += f" (on {', '.join(task.removeprefix('spot_') for task in unclear)} the interval cannot tell)"
        if share[[trained, free]].notna().all():
            said += f"; of the perfect-order bound, {share[trained]:.0%} against {share[free]:.0%} on average"
        if behind:
            said += "; " + display_name(free) + " saved more on " + ", ".join(
                f"{task.removeprefix('spot_')} ({cell[(task, free)]:.2f}× against {cell[(task, trained)]:.2f}×)" for task in behind)
        lines.append(said + ".")
    return lines


def rival_table(table: pd.DataFrame) -> pd.DataFrame:
    """The display form: a row per (T, policy, method), a column per task, cells `fwd × (share of bound)`."""
    shown = table.assign(row=[f"T = {t:g}, {p}: {display_name(lab)}" for t, p, lab in zip(table.temperature, table.policy,
                                                                                       table.label, strict=True)],
                         cell=[shown_ratio(f, lo, hi) + ("" if pd.isna(s) else f" ({s:.0%})")
                               for f, lo, hi, s in zip(table.forward_mean, table.forward_low, table.forward_high,
                                                       table.share_of_bound, strict=True)])
    order = {row: (t, p != table2.ANCHOR, table2.row_key(lab)) for row, t, p, lab in
             zip(shown.row, shown.temperature, shown.policy, shown.label, strict=True)}
    out = shown.pivot_table(index="row", columns="task", values="cell", aggfunc="first")
    out = out.loc[sorted(out.index, key=order.__getitem__)]
    out.columns = [c.removeprefix("spot_") for c in out.columns]
    out.index.name = "method"
    return out


WHY_WALL_CLOCK = ("Why wall clock differs from forwards: on a CPU a verify forward of P pieces costs about P "
                  "forwards (the verify-cost curve on the Performance results page), so the forwards a method saves turn "
                  "into little wall-clock time, or less than none; on a GPU, where a forward of a few pieces costs about "
                  "as much as one, the forward ratio is what carries over.")


LEADER_BUDGET = 8  # the verify size the verdict names each task's leader at (the paper's smaller budget)
IDLE_TAU = 1.1  # below it a method's speed is draft-free decoding's own: it hardly speculated


def findings(numbers: pd.DataFrame, device: str, against: pd.DataFrame, averaged: pd.DataFrame | None = None) -> list[str]:
    """What the comparison found, in words, per temperature and policy: lossless or not, the most forwards saved,
    the fastest on this device against draft-free (`averaged`: means(), whose interval of the mean over the tasks
    says whether it is faster, or cannot be told from draft-free), and the rivals (`against`: rivals(numbers), which
    the report's table shows too); then why wall clock differs from forwards."""
    lines = []
    methods = numbers[(numbers.label != "draft_free") & ~numbers.label.str.startswith(f"{BOUND}@")]
    for (t, policy), rows in methods.groupby(["temperature", "policy"], sort=True):
        per = rows.groupby("label", sort=False).agg(forward=("forward_mean", "mean"), throughput=("throughput_mean", "mean"),
                                                    lossless=("lossless", "min"), lossy=("lossy", "max"),
                                                    tau=("accepted_mean", "mean"), tasks=("forward_mean", "count"))
        exact = per[~per.lossy.astype(bool)]
        broken = exact[exact.lossless < 1]
        said = [f"**T = {t:g}, {policy} decoding.** "]
        said.append(f"Every lossless method's outputs were token-identical to draft-free decoding ({len(exact)} methods)"
                    if broken.empty else f"Diverged from draft-free: {', '.join(display_name(x) for x in broken.index)}")
        # A mean over fewer tasks is not comparable with the others' (the tasks differ in how much can be saved):
        # such a method is named, and left out of the leaders by mean.
        everywhere = rows[rows.forward_mean.notna()].task.nunique()
        partial = per[per.tasks < everywhere]
        per = per[per.tasks == everywhere]
        if not per.forward.isna().all():
            top = per.forward.idxmax()
            said.append(f"; the most forwards saved: {display_name(top)}, {per.forward[top]:.2f}× (mean over the tasks)")
        if not per.throughput.isna().all():
            fast = per.throughput.idxmax()
            idle = f" (τ {per.tau[fast]:.2f}: it drafted almost nothing that was accepted)" if per.tau[fast] < IDLE_TAU else ""
            said.append(f"; in wall-clock time on {device} the fastest was {display_name(fast)} at {per.throughput[fast]:.2f}×"
                        + idle + _against_draft_free(per.throughput[fast], _interval(averaged, policy, t, fast)))
        if not partial.empty:
            said.append("; decoded on fewer of the tasks, so not averaged with the others: " + ", ".join(
                f"{display_name(x)} ({n} of {everywhere})" for x, n in partial.tasks.items()))
        lines.append("".join(said) + ".")
    return [*lines, *rival_verdicts(against), *leaders_at(against, LEADER_BUDGET), WHY_WALL_CLOCK]


def _interval(averaged: pd.DataFrame | None, policy: str, t: float, label: str) -> tuple[float, float] | None:
    """The 95% interval of a method's mean throughput ratio over the tasks, where means() gave one."""
    if averaged is None or "throughput_low" not in averaged:
        return None
    row = averaged[(averaged.policy == policy) & (averaged.temperature == t) & (averaged.label == label)]
    return None if row.empty or row.throughput_low.isna().all() else (row.throughput_low.iloc[0], row.throughput_high.iloc[0])


def against_draft_free(ratio: float, interval: tuple[float, float] | None) -> str:
    """A wall-clock ratio over draft-free decoding, read with its 95% interval (None: not known): "no faster" (at or
    below 1.00 as printed), "faster" (the interval, where known, above 1) or "cannot tell" (the interval reaches 1).
    The verdict and the docs' results page both word it from here."""
    if round(ratio, 2) <= 1:
        return "no faster"
    return "faster" if interval is None or interval[0] > 1 else "cannot tell"


def _against_draft_free(ratio: float, interval: tuple[float, float] | None) -> str:
    said = against_draft_free(ratio, interval)
    if said == "no faster":
        return ": no method beat draft-free decoding in wall-clock time here"
    if interval is None:
        return ", faster than draft-free decoding"
    low, high = interval
    if said == "faster":
        return f", faster than draft-free decoding (the interval of its mean over the tasks, [{low:.2f}, {high:.2f}], lies above 1)"
    return f", but the interval of its mean over the tasks, [{low:.2f}, {high:.2f}], cannot tell it from draft-free decoding"


def compare(bundle: Bundle) -> list[Comparison]:
    numbers = table2.numbers(bundle)
    if not (numbers.label != "draft_free").any():
        raise ValueError("the results hold no speculative method, only draft-free decoding; run with methods=...")
    return [Comparison(float(t), caption(bundle, t), table2.sections(numbers, t), rows)
            for t, rows in numbers.groupby("temperature", sort=True)]


def accuracy_table(bundle: Bundle) -> pd.DataFrame:
    """lm-eval's accuracy metrics only (no sample_len), per task, decoding policy, metric and temperature: mean over seeds
    (and over pooled items, each once)."""
    acc = table2.accuracy_metrics(bundle)
    if acc.empty:
        return acc
    means = table2.mean_accuracy(acc, ["task", "policy", "metric", "temperature"])
    return means.pivot_table(index=["task", "policy", "metric"], columns="temperature", values="accuracy", aggfunc="first").rename(
        columns=lambda t: f"T = {t:g}").reset_index()


def figures(bundle: Bundle, numbers: pd.DataFrame, out_dir: Path, date: str, stem: str) -> list[tuple[str, Path]]:
    """The grouped throughput and forward bars, the accepted-steps histogram and the frontier of a bundle."""
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
        ("forwards saved against draft nodes verified per forward, a line per method through its budgets; the oracle's "
         "is the perfect-order replay bound",
         plots.frontier(numbers, out_dir / f"{stem}frontier.png",
                        figure_title("forwards saved at equal verify size, and the bound", who, date))),
    ]


def means(bundle: Bundle, numbers: pd.DataFrame) -> pd.DataFrame:
    """Per temperature, policy and method: each ratio's mean over the tasks (what the README's headline shows) and the
    95% interval of that mean, from the same resamples of each task's items as the per-task intervals."""
    keys = ["policy", "temperature", "task"]
    replicates = ratio_replicates(bundle.samples, keys, anchor=table2.ANCHOR)
    rows = []
    for (policy, t, label), cells in numbers.groupby(["policy", "temperature", "label"], sort=False):
        row = {"policy": policy, "temperature": t, "label": label, "tasks": len(cells)}
        for name, column in (("forward", "forward_mean"), ("throughput", "throughput_mean"), ("to_eos", "forward_ratio_to_eos")):
            if column not in cells:
                continue
            row[column] = cells[column].mean()
            row[f"{name}_low"], row[f"{name}_high"] = mean_interval(replicates, (policy, t, label), keys.index("task"), name)
        if "after_eos_share" in cells:
            row["after_eos_share"] = cells["after_eos_share"].mean()
        rows.append(row)
    return pd.DataFrame(rows)


def item_counts(bundle: Bundle, numbers: pd.DataFrame) -> pd.DataFrame:
    """Per policy, temperature and task: the items decoded, the widest forward interval there and the items that would
    bring it within ±5% of its ratio (results.items_needed), as the report shows them."""
    keys = ["policy", "temperature", "task"]
    items = bundle.samples.groupby(keys).doc_id.nunique().rename("items").reset_index()
    plan = items_needed(numbers, items, keys)
    return pd.DataFrame({
        "policy": plan.policy, "T": plan.temperature.map("{:g}".format), "task": plan.task.str.removeprefix("spot_"),
        "items": plan["items"], "widest interval": [f"±{w:.1%} ({display_name(label)})" for w, label in
                                                    zip(plan.half_width, plan.label, strict=True)],
        f"items for ±{WANTED_HALF_WIDTH:.0%}": plan.needed,
    })


def write_comparison(bundle: Bundle, out_dir: str | Path, date: str | None = None) -> list[Path]:
    """compare.md / compare.html, one CSV per temperature (long form), the means over the tasks with their intervals
    (compare_means.csv) and the figures."""
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
    numbers = pd.concat([c.numbers for c in comparisons], ignore_index=True)
    averaged = means(bundle, numbers)
    averaged.to_csv(out_dir / "compare_means.csv", index=False)
    files.append(out_dir / "compare_means.csv")
    date = date or (bundle.created or "")[:10]
    shown = figures(bundle, numbers, out_dir, date, "compare_")
    files += [path for _, path in shown]
    against = rivals(numbers)
    verdict = findings(numbers, bundle.identity.get("device") or "this device", against, averaged)
    sections.insert(0, Section("Verdict", "\n\n".join(verdict)))
    if not against.empty:
        sections.insert(1, Section("Against the rivals and the bound",
                                   "Per fixed budget, each method's forwards × over draft-free and, where the oracle ran at "
                                   "that budget, its share of the perfect-order bound: (ratio − 1) / (oracle's − 1). The "
                                   "verdict above reads them.",
                                   tables=(("at each fixed budget", rival_table(against)),), figures=(shown[3],)))
    sections.append(Section(
        "Items behind the intervals",
        "Each interval is a bootstrap over the task's items, and narrows as one over the square root of their number. "
        "Per task, the widest forward interval of any method, as a share of its ratio, and about how many items would "
        f"bring it within ±{WANTED_HALF_WIDTH:.0%}: the suites take that many, or the task's whole test split.",
        tables=(("items per task", item_counts(bundle, numbers)),)))
    sections.append(Section("Speed per task and method", figures=tuple(shown[:2])))
    sections.append(Section("Accepted steps per forward", figures=(shown[2],)))
    accuracy = accuracy_table(bundle)
    if not accuracy.empty:
        sections.append(Section("Accuracy", "lm-eval's scores of the draft-free text of each decoding policy (mean over seeds, "
                                            "and over pooled results' items, each once); every lossless method's outputs are "
                                            "the same text.", tables=(("accuracy per task", accuracy),)))
    lead = (f"The SPOT paper's Table 2 (arXiv 2610.22543), measured by spot-eval on {bundle.settings.get('target')}: "
            f"{len(bundle.samples.drop_duplicates(['temperature', 'seed', 'task', 'doc_id']))} requests in {len(bundle.runs)} run(s).")
    report = Report("SPOT, SPOT-Sets and the lossless rivals against draft-free decoding", lead, sections,
                    header(bundle.identity, date=date))
    files += list(write(report, out_dir, "compare"))
    return files
