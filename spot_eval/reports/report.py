"""Markdown and self-contained HTML from tables and figures (nightly reports, comparisons).

A `Report` is a title, a lead paragraph and sections of text, tables and PNG figures. The HTML
embeds the figures as data URIs, so one file can be mailed or attached to an MLflow run.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class Section:
    heading: str
    text: str = ""
    tables: tuple[tuple[str, pd.DataFrame], ...] = ()  # (caption, table)
    figures: tuple[tuple[str, Path], ...] = ()  # (caption, PNG path)


@dataclass(frozen=True)
class Report:
    title: str
    lead: str
    sections: list[Section] = field(default_factory=list)


def _format(value: object, digits: int = 3) -> str:
    if isinstance(value, float):
        return "" if pd.isna(value) else f"{value:.{digits}f}"
    return str(value)


def markdown_table(table: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub-flavoured markdown table (no tabulate dependency); floats to `digits` decimals."""
    def cell(value: object) -> str:
        return _format(value, digits).replace("|", "\\|")

    header = "| " + " | ".join(str(c) for c in table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def to_markdown(report: Report, base: Path) -> str:
    parts = [f"# {report.title}", "", report.lead, ""]
    for s in report.sections:
        parts += [f"## {s.heading}", ""]
        if s.text:
            parts += [s.text, ""]
        for caption, table in s.tables:
            parts += [f"*{caption}*", "", markdown_table(table), ""]
        for caption, path in s.figures:
            parts += [f"![{caption}]({path.relative_to(base) if path.is_relative_to(base) else path})", ""]
    return "\n".join(parts)


def to_html(report: Report) -> str:
    def bold_markup(text: str) -> str:
        escaped = html.escape(text)
        pieces = escaped.split("**")
        return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(pieces))

    body = [f"<h1>{html.escape(report.title)}</h1>", f"<p>{bold_markup(report.lead)}</p>"]
    for s in report.sections:
        body.append(f"<h2>{html.escape(s.heading)}</h2>")
        if s.text:
            body += [f"<p>{bold_markup(p)}</p>" for p in s.text.split("\n\n")]
        for caption, table in s.tables:
            cells = table.map(lambda v: bold_markup(_format(v)))  # **x** (the best cell) becomes <b>x</b>
            rendered = cells.to_html(index=False, escape=False)
            body.append(f"<figure><figcaption>{html.escape(caption)}</figcaption>{rendered}</figure>")
        for caption, path in s.figures:
            data = base64.b64encode(path.read_bytes()).decode()
            body.append(f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:0.9em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
             "figure{margin:1em 0}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(report.title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def write(report: Report, out_dir: Path, stem: str = "report") -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md, page = out_dir / f"{stem}.md", out_dir / f"{stem}.html"
    md.write_text(to_markdown(report, out_dir) + "\n")
    page.write_text(to_html(report))
    return md, page
