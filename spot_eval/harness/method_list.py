"""`spot-eval methods`: every method a run can name, with where it comes from, what it reads, what a new target
costs it and whether its outputs are exact."""

from __future__ import annotations

from collections.abc import Sequence

from spot_eval import registry


def method_rows(plugins: Sequence[str] = ()) -> list[dict]:
    """One row per method (built in first, then installed packages', then the plugin files'), as JSON-ready dicts."""
    registry.load_plugins(plugins, "--plugins")
    rows = []
    for name, e in registry.entries().items():
        m = e.method
        if m.build is None:  # draft_free: the reference every method is diffed against, not a method
            continue
        rows.append({"name": name, "display": m.display, "origin": str(e.origin), "reads": m.what_it_reads,
                     "new_target": m.cost or ("nothing: not a method to deploy" if m.needs_reference else "(not said)"), "exact": not m.lossy, "budget_auto": m.auto,
                     "bound": m.needs_reference, "colour": m.colour})
    return rows


def method_table(rows: list[dict]) -> str:
    """The rows as aligned text, with a line on what each column means."""
    columns = (("name", "method"), ("origin", "from"), ("exact", "exact"), ("reads", "reads"), ("new_target", "a new target costs"))

    def cell(row: dict, key: str) -> str:
        if key == "exact":
            return "yes" if row["exact"] else "LOSSY (max-commit, opt-in)"
        return str(row[key])

    widths = {key: max(len(title), *(len(cell(r, key)) for r in rows)) for key, title in columns}
    head = "  ".join(f"{title:<{widths[key]}}" for key, title in columns)
    lines = [head, "  ".join("-" * widths[key] for key, _ in columns)]
    lines += ["  ".join(f"{cell(r, key):<{widths[key]}}" for key, _ in columns).rstrip() for r in rows]
    lines += ["", "exact: its outputs are token-identical to draft-free decoding (spot-eval check-method NAME proves it "
                  "for one method); a plugin's method: install its package, or name its file with plugins=FILE "
                  "(lm_eval) / --plugins FILE (spot-eval)."]
    return "\n".join(lines)
