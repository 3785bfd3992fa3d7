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
from spot_eval.reports.results import Bundle, over_seeds, summarize

ANCHOR = "single"  # the policy every section is anchored on: standard single-commit decoding
FAMILIES = tuple(f.name for f in families.FAMILIES)  # row order within a section (a plugin's methods after, by name)
LOSSLESS, DIVERGED, INCONCLUSIVE, BY_DESIGN = "✓", "✗", "inconclusive", "lossy"
COLUMNS = ("tput ×", "fwd ×", "τ", "acc.", "lossless")  # throughput and forward ratios; τ: mean accepted steps per forward (Spec-Bench)


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


def _accuracy(bundle: Bundle) -> pd.DataFrame:
    """Per policy, temperature and task: the mean over seeds of lm-eval's first accuracy metric of the task
    (it scores the draft-free text, which every lossless method reproduces), and that metric's name."""
    acc = accuracy_metrics(bundle)
    if acc.empty:
        return pd.DataFrame(columns=["policy", "temperature", "task", "metric", "accuracy"])
    first = acc.drop_duplicates("task").set_index("task").metric  # lm-eval lists a task's primary metric first
    acc = acc[acc.metric == acc.task.map(first)]
    return acc.groupby(["policy", "temperature", "task", "metric"], as_index=False).agg(accuracy=("value", "mean"))


COLUMNS_OUT = ("policy", "temperature", "task", "label", "throughput_mean", "throughput_std", "forward_mean", "forward_std",
               "lossless", "lossy", "seeds", "requests", "accepted_mean", "mean_tree_size", "drafter_share")  # and the accuracy


def numbers(bundle: Bundle) -> pd.DataFrame:
    """Long form: per policy, temperature, task and label, each cell's numbers (spot_eval.reports.results: ratios are
    the mean and std over seeds, tau of the sums), each policy's draft-free decoder over the single-commit anchor."""
    keys = ["policy", "temperature", "task"]
    out = over_seeds(summarize(bundle.samples, [*keys, "seed"], anchor=ANCHOR), keys)[list(COLUMNS_OUT)]
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


def _ratio(mean: float, std: float, seeds: int) -> str:
    if pd.isna(mean):  # no reference decoder in the results (a threshold run without its single-commit anchor)
        return "—"
    return f"{mean:.2f}" + (f" ± {std:.2f}" if seeds > 1 and pd.notna(std) else "")


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
                line.update({(task, q): "—" for q in COLUMNS})
                continue
            r = match.iloc[0]
            reference = lab == "anchor" or (lab == "draft_free" and policy == ANCHOR)
            seeds = 1 if reference else r.seeds  # a reference is 1.00 by definition: no spread to show
            values = {"tput ×": (r.throughput_mean, _ratio(r.throughput_mean, r.throughput_std, seeds)),
                      "fwd ×": (r.forward_mean, _ratio(r.forward_mean, r.forward_std, seeds)),
                      "τ": (r.accepted_mean, f"{r.accepted_mean:.2f}")}
            for q, (value, text) in values.items():
                # the best speculative cell, where it beats draft-free decoding: a best slowdown is no win
                marked = lab not in ("draft_free", "anchor") and value == best[(task, q)] and value > 1
                line[(task, q)] = f"**{text}**" if marked else text
            line[(task, "acc.")] = "—" if pd.isna(r.accuracy) else f"{r.accuracy:.2f}"
            line[(task, "lossless")] = "reference" if reference else ("—" if lab == "draft_free" else verdict(r))
        cells[names[lab]] = line
    out = pd.DataFrame.from_dict(cells, orient="index")
    out.columns = pd.MultiIndex.from_tuples([(t.removeprefix("spot_"), q) for t, q in out.columns], names=["task", ""])
    out.index.name = "method"
    out.attrs["html_class"] = "table2"
    return out
