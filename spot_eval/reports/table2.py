"""The seed paper's Table 2: one row per method, one column group per task.

A section per decoding policy. Single-commit decoding holds draft-free decoding (the anchor), then
Spiffy, SPOT and SPOT-gamma at each budget, then budget=auto. Methods that speculate on another
policy (SPOT-Sets on threshold decoding) sit in that policy's section, against that policy's own
draft-free decoder, as the paper reports them, under the same single-commit anchor row: there the
threshold decoder's ratios are over the anchor.

Each task's column group holds, per method: throughput x and forwards x over the section's
reference (draft-free seconds / method seconds and likewise forwards, summed over the same requests;
mean ± std over seeds), accepted steps per target forward (1.00 for a draft-free decoder, as in
Spec-Bench's leaderboard; under single commit a step is a token), the task's accuracy (lm-eval's
first metric), and the lossless verdict: ✓ every request token-identical to draft-free *and*
some draft accepted; "inconclusive" when nothing drafted was ever accepted (budget=auto choosing 0,
say), so that ✓ always means speculation ran and matched; ✗ with the share of identical requests;
"lossy" for a method that differs by design (max-commit).
"""

from __future__ import annotations

import pandas as pd

from spot_eval import families, registry
from spot_eval.reports.results import Bundle, intervals, over_seeds, summarize

ANCHOR = "single"  # the policy every section is anchored on: standard single-commit decoding
FAMILIES = tuple(f.name for f in families.FAMILIES)  # row order within a section (a plugin's methods after, by name)
LOSSLESS, DIVERGED, INCONCLUSIVE, BY_DESIGN = "✓", "✗", "inconclusive", "lossy"
COLUMNS = ("tput ×", "fwd ×", "τ", "acc.", "lossless")  # throughput and forward ratios; τ: mean accepted steps per forward (Spec-Bench)
# Beside the forward ratio, where the results count padding: the ratio without the forwards spent after the answer's
# first EOS, and their share of the method's forwards (spot_eval.harness.padding). Table 2's fwd × is the paper's, of
# the whole generation.
PADDING_COLUMNS = ("fwd × to EOS", "after EOS")


def row_key(label: str) -> tuple[int, int, int, str]:
    """Row order: draft-free first, then each family at rising budgets, budget=auto after every fixed budget."""
    name, _, budget = label.partition("@")
    family = FAMILIES.index(name) if name in FAMILIES else len(FAMILIES)
    return (budget == "auto", family, int(budget) if budget.lstrip("-").isdigit() else 0, label)


def display_name(label: str, policy: str = ANCHOR) -> str:
    """`spot@8` -> `SPOT @8`; a policy's own draft-free decoder is named for the policy (`threshold`)."""
    if label == "draft_free" and policy != ANCHOR:
        return f"{policy} decoding"
    name, _, budget = label.partition("@")
    display = registry.described(name).display
    return f"{display} @{budget}" if budget else display


def accuracy_metrics(bundle: Bundle) -> pd.DataFrame:
    """lm-eval's scores that are accuracy metrics (not sample_len), each with its decoding policy."""
    acc = bundle.accuracy
    return acc if acc.empty else acc[~acc.metric.str.startswith("sample_len")]


def mean_accuracy(acc: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per `keys`, the mean of the scores (`accuracy`): weighted by the items each covers where pooled results
    carry it (`weight`, spot_eval.reports.results.combine), else over seeds alike."""
    weight = acc["weight"] if "weight" in acc.columns else pd.Series(1.0, index=acc.index)
    sums = acc.assign(weighted=acc.value * weight, weight=weight).groupby(keys, as_index=False)[["weighted", "weight"]].sum()
    return sums.assign(accuracy=sums.weighted / sums.weight)[[*keys, "accuracy"]]


def _accuracy(bundle: Bundle) -> pd.DataFrame:
    """Per policy, temperature and task: the mean over seeds (and pooled items) of lm-eval's first accuracy metric
    of the task (it scores the draft-free text, which every lossless method reproduces), and that metric's name."""
    acc = accuracy_metrics(bundle)
    if acc.empty:
        return pd.DataFrame(columns=["policy", "temperature", "task", "metric", "accuracy"])
    first = acc.drop_duplicates("task").set_index("task").metric  # lm-eval lists a task's primary metric first
    return mean_accuracy(acc[acc.metric == acc.task.map(first)], ["policy", "temperature", "task", "metric"])


COLUMNS_OUT = ("policy", "temperature", "task", "label", "throughput_mean", "throughput_std", "forward_mean", "forward_std",
               "lossless", "lossy", "seeds", "requests", "accepted_mean", "mean_tree_size", "drafter_share")  # and the accuracy


# Beside them, where the results hold what they need: each ratio's 95% interval over the items (forward_low, ...), and
# the padding (spot_eval.harness.padding): the share of forwards after the answer's first EOS, and the forward ratio
# without those forwards with its interval. Results written before they were kept load without them.
COLUMNS_NEW = ("forward_ratio", "forward_low", "forward_high", "throughput_ratio", "throughput_low", "throughput_high", "after_eos_share",
               "forward_ratio_to_eos", "to_eos_low", "to_eos_high")


def numbers(bundle: Bundle) -> pd.DataFrame:
    """Long form: per policy, temperature, task and label, each cell's numbers (spot_eval.reports.results: ratios are
    the mean and std over seeds, tau of the sums; the intervals and the padding of the sums over every seed), each
    policy's draft-free decoder over the single-commit anchor."""
    keys = ["policy", "temperature", "task"]
    out = over_seeds(summarize(bundle.samples, [*keys, "seed"], anchor=ANCHOR), keys)[list(COLUMNS_OUT)]
    pooled = summarize(bundle.samples, keys, anchor=ANCHOR)
    # the ratios of the sums over every seed, which the intervals are of (over one seed: forward_mean and throughput_mean)
    padding = ["forward_ratio", "throughput_ratio", *(c for c in ("after_eos_share", "forward_ratio_to_eos") if c in pooled.columns)]
    out = out.merge(pooled[[*keys, "label", *padding]], on=[*keys, "label"], how="left")
    out = out.merge(intervals(bundle.samples, keys, anchor=ANCHOR), on=[*keys, "label"], how="left")
    out = out[[*COLUMNS_OUT, *(c for c in COLUMNS_NEW if c in out.columns)]]
    out = out.merge(_accuracy(bundle), on=keys, how="left")
    # A lossless method's text is draft-free's, so its score is too; a lossy one's own score is not at hand here.
    out.loc[out.lossy.astype(bool) | (out.lossless < 1), "accuracy"] = float("nan")
    return out.sort_values(["temperature", "policy", "task"], key=lambda c: c.map(_policy_rank) if c.name == "policy" else c,
                           kind="stable").reset_index(drop=True)


def _policy_rank(policy: str) -> tuple[int, str]:
    return (policy != ANCHOR, policy)


def verdict(row: pd.Series) -> str:
    """The lossless cell of a speculative method (see the module docstring)."""
    if row.lossy:
        return f"{BY_DESIGN}, {1 - row.lossless:.0%} differ"
    if row.lossless < 1:
        return f"{DIVERGED} {row.lossless:.0%}"
    return LOSSLESS if row.accepted_mean > 1 else INCONCLUSIVE


def shown_ratio(mean: float, low: float = float("nan"), high: float = float("nan"), std: float = float("nan"),
                seeds: int = 1) -> str:
    """A ratio as every report prints it: with its 95% interval over the items where the results give one
    (`2.31 [2.10, 2.55]`), else with its std over seeds (results before the intervals: `2.31 ± 0.04`)."""
    if pd.isna(mean):  # no reference decoder in the results (a threshold run without its single-commit anchor)
        return "—"
    if pd.notna(low) and pd.notna(high):
        return f"{mean:.2f} [{low:.2f}, {high:.2f}]"
    return f"{mean:.2f}" + (f" ± {std:.2f}" if seeds > 1 and pd.notna(std) else "")


def _get(row: pd.Series, column: str) -> float:
    return row[column] if column in row.index else float("nan")


def _with_interval(row: pd.Series, name: str, shown: bool) -> str:
    """A cell's `name` ratio (forward, throughput): the ratio of the sums over every seed with its interval where the
    results give one, else the mean ± std over seeds; a reference's (`shown` False) alone."""
    low, high = (_get(row, f"{name}_low"), _get(row, f"{name}_high")) if shown else (float("nan"), float("nan"))
    if pd.notna(low):
        return shown_ratio(row[f"{name}_ratio"], low, high)
    return shown_ratio(row[f"{name}_mean"], std=row[f"{name}_std"], seeds=row.seeds if shown else 1)


def sections(table: pd.DataFrame, temperature: float) -> list[tuple[str, pd.DataFrame]]:
    """The display tables at one temperature, one per policy: rows are methods (index `method`), columns
    (task, quantity) pairs; the best speculative cell per column in **bold** where it beats draft-free (above 1)."""
    at = table[table.temperature == temperature]
    anchor = at[(at.policy == ANCHOR) & (at.label == "draft_free")]
    out = []
    for policy in sorted(at.policy.unique(), key=_policy_rank):
        rows = at[at.policy == policy]
        if policy != ANCHOR:  # the common anchor row above the policy's own decoder
            rows = pd.concat([anchor.assign(label="anchor"), rows], ignore_index=True)
        out.append((policy, _display(rows, policy)))
    return out


def _display(rows: pd.DataFrame, policy: str) -> pd.DataFrame:
    tasks = sorted(rows.task.unique())
    padded = "after_eos_share" in rows.columns and rows.after_eos_share.notna().any()
    quantities = (*COLUMNS[:2], *PADDING_COLUMNS, *COLUMNS[2:]) if padded else COLUMNS
    speculative = rows[~rows.label.isin(["draft_free", "anchor"])]
    best = {(task, q): speculative[speculative.task == task][column].max()
            for task in tasks for q, column in (("tput ×", "throughput_mean"), ("fwd ×", "forward_mean"),
                                                ("τ", "accepted_mean"))}
    labels = sorted(rows.label.unique(), key=lambda lab: (lab != "anchor", row_key(lab)))
    names = {lab: display_name("draft_free") + " (anchor)" if lab == "anchor" else display_name(lab, policy) for lab in labels}
    cells: dict[str, dict[tuple[str, str], str]] = {}
    for lab in labels:
        line = {}
        for task in tasks:
            match = rows[(rows.label == lab) & (rows.task == task)]
            if match.empty:
                line.update({(task, q): "—" for q in quantities})
                continue
            r = match.iloc[0]
            reference = lab == "anchor" or (lab == "draft_free" and policy == ANCHOR)
            shown = not reference  # a reference is 1.00 by definition: no spread or interval to show
            values = {"tput ×": (r.throughput_mean, _with_interval(r, "throughput", shown)),
                      "fwd ×": (r.forward_mean, _with_interval(r, "forward", shown))}
            if padded:
                values["fwd × to EOS"] = (float("nan"), shown_ratio(r.forward_ratio_to_eos, *(
                    _get(r, c) if shown else float("nan") for c in ("to_eos_low", "to_eos_high"))))
                values["after EOS"] = (float("nan"), f"{r.after_eos_share:.0%}")
            values["τ"] = (r.accepted_mean, f"{r.accepted_mean:.2f}")
            for q, (value, text) in values.items():
                # the best speculative cell, where it beats draft-free decoding: a best slowdown is no win
                marked = lab not in ("draft_free", "anchor") and value == best.get((task, q)) and value > 1
                line[(task, q)] = f"**{text}**" if marked else text
            line[(task, "acc.")] = "—" if pd.isna(r.accuracy) else f"{r.accuracy:.2f}"
            line[(task, "lossless")] = "reference" if reference else ("—" if lab == "draft_free" else verdict(r))
        cells[names[lab]] = line
    out = pd.DataFrame.from_dict(cells, orient="index")
    out.columns = pd.MultiIndex.from_tuples([(t.removeprefix("spot_"), q) for t, q in out.columns], names=["task", ""])
    out.index.name = "method"
    out.attrs["html_class"] = "table2"
    return out
