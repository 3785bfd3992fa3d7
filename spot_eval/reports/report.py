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
    header: dict[str, str] = field(default_factory=dict)  # the run's identity, shown under the title


IDENTITY = (("target", "target"), ("revision", "revision"), ("dtype", "dtype"), ("device", "device"), ("gpu", "GPU"),
            ("batch_size", "batch size"), ("torch", "torch"), ("transformers", "transformers"), ("lm_eval", "lm-eval"),
            ("commit", "commit"), ("peak_memory_mb", "peak memory (MB)"))
STATUS = {"PASS": "pass", "FAIL": "fail", "n/a": "na"}  # verdict words and their colour classes


def header(identity: dict[str, str], **more: str) -> dict[str, str]:
    """The identity fields a report's header shows, in a fixed order, named for readers; `more` first."""
    out = {k: v for k, v in more.items() if v}
    out.update({name: identity[key] for key, name in IDENTITY if identity.get(key)})
    return out


def figure_title(what: str, identity: dict[str, str], date: str) -> str:
    """A figure's title: what it shows, then what was run (target, dtype, device, date, commit)."""
    ran = [identity.get("target"), identity.get("dtype"), identity.get("gpu") or identity.get("device"), date,
           f"commit {identity['commit'][:10]}" if identity.get("commit") else None]
    return f"{what}\n{' · '.join(x for x in ran if x)}"


def _format(value: object, digits: int = 3) -> str:
    if isinstance(value, float):
        return "" if pd.isna(value) else f"{value:.{digits}f}"
    return str(value)


def markdown_table(table: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub-flavoured markdown table (no tabulate dependency); floats to `digits` decimals. A named index
    becomes the first column, and two-level columns (Table 2's task groups) read `task: quantity`."""
    def cell(value: object) -> str:
        return _format(value, digits).replace("|", "\\|")

    if table.index.name is not None:
        table = table.reset_index()
    if isinstance(table.columns, pd.MultiIndex):
        table = table.set_axis([": ".join(str(p) for p in c if p) for c in table.columns], axis=1)
    header = "| " + " | ".join(str(c) for c in table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def to_markdown(report: Report, base: Path) -> str:
    parts = [f"# {report.title}", ""]
    if report.header:
        parts += [" · ".join(f"{k}: {v}" for k, v in report.header.items()), ""]
    parts += [report.lead, ""]
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

    def cell(value: object) -> str:
        text = _format(value)
        if text in STATUS:  # a gate's verdict, in words and colour
            return f'<span class="{STATUS[text]}">{text}</span>'
        return bold_markup(text)  # **x** (the best cell) becomes <b>x</b>

    body = [f"<h1>{html.escape(report.title)}</h1>"]
    if report.header:
        body.append('<dl class="identity">' + "".join(f"<div><dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd></div>"
                                                  for k, v in report.header.items()) + "</dl>")
    body.append(f'<p class="lead">{bold_markup(report.lead)}</p>')
    for s in report.sections:
        body.append(f"<h2>{html.escape(s.heading)}</h2>")
        if s.text:
            body += [f"<p>{bold_markup(p)}</p>" for p in s.text.split("\n\n")]
        for caption, table in s.tables:
            rendered = table.map(cell).to_html(index=table.index.name is not None, escape=False, border=0,
                                               classes=table.attrs.get("html_class"), index_names=False)
            body.append(f'<figure><figcaption>{html.escape(caption)}</figcaption><div class="scroll">{rendered}</div></figure>')
        for caption, path in s.figures:
            data = base64.b64encode(path.read_bytes()).decode()
            body.append(f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(report.title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n")


STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1400px;margin:2em auto;padding:0 1em;color:#222;line-height:1.4}"
    "h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid #ddd}"
    ".identity{display:flex;flex-wrap:wrap;gap:.2em 1.4em;font-size:.85em;color:#555;margin:0 0 1em}"
    ".identity div{display:flex;gap:.3em}.identity dt{font-weight:600}.identity dd{margin:0}"
    ".lead{font-size:1.05em}.scroll{overflow-x:auto}"
    "table{border-collapse:collapse;font-size:.8em;margin:.3em 0}"
    "td,th{border:1px solid #ccc;padding:1px 5px;text-align:right;white-space:nowrap}"
    "thead th{background:#f4f4f4;text-align:center}tbody th{text-align:left}"
    ".pass{color:#fff;background:#1a7f37;padding:0 .4em;border-radius:3px}"
    ".fail{color:#fff;background:#cf222e;padding:0 .4em;border-radius:3px}"
    ".na{color:#fff;background:#6e7781;padding:0 .4em;border-radius:3px}"
    "figure{margin:1em 0}figcaption{font-size:.85em;color:#555}img{max-width:100%}"
)


def write(report: Report, out_dir: Path, stem: str = "report") -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md, page = out_dir / f"{stem}.md", out_dir / f"{stem}.html"
    md.write_text(to_markdown(report, out_dir) + "\n")
    page.write_text(to_html(report))
    return md, page
