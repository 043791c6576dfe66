"""The run report: one row per before/after pair, generated from the records (never typed in).

Written as Markdown and HTML beside the executed notebooks, and as ``report.md`` in the device's
results folder. ``readme_table`` renders the headline metrics of the committed reference (the full
profile's ``summary.json``) for the README.

Each headline metric says which commit made its records. A metric is marked *stale* when it comes from
another commit than the profile's newest record (part of the reference was run again at a later commit
and this metric was not), and *not HEAD* when a ``head`` commit is given and differs.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from mahia.measure.files import atomic_write_text
from mahia.measure.results import (
    GOALS,
    HEADLINE_KEYS,
    goal_status,
    headline,
    latest,
    load_records,
    pairs,
    profiles,
    read_summary,
    write_summaries,
)

__all__ = ["NotebookOutcome", "build_report", "write_report", "readme_table", "report_profile", "commit_marks"]


class NotebookOutcome(dict):
    """name, status ('ok' | 'failed' | 'timeout' | 'skipped'), seconds, output, error, cell."""


def _fmt(x, spec=".3g", none="—"):
    if x is None or (isinstance(x, float) and x != x):
        return none
    return format(x, spec)


def _device_line(df: pd.DataFrame) -> str:
    if df.empty:
        return "no records"
    devs = sorted(set(df["device"].dropna().astype(str)))
    date = str(df["date"].max())[:10]
    cpu = not any("cpu" not in str(s) for s in df["device_slug"].dropna()) if "device_slug" in df else False
    note = " (a CPU run: timings say nothing about a GPU)" if cpu else ""
    return f"verified on {', '.join(devs)}, {date}{note}"


def report_profile(df: pd.DataFrame) -> str:
    """The profile a report shows: full (the reference's) when it has records, else the newest record's."""
    found = profiles(df)
    if not found or "full" in found:
        return "full"
    return str(df.sort_values("date")["profile"].iloc[-1])


def commit_marks(doc: dict, key: str, head: str | None = None) -> str:
    """'abc123', 'abc123 (stale)', 'abc123 (not HEAD)' for one metric of a ``headline`` document."""
    cs = doc["sources"].get(key)
    if not cs:
        return ""
    marks = []
    if key in doc["stale"]:
        marks.append("stale")
    if head is not None and any(c != head for c in cs):
        marks.append("not HEAD")
    return ", ".join(cs) + (f" ({', '.join(marks)})" if marks else "")


def _commits_line(doc: dict, head: str | None = None) -> str:
    if not doc["commits"]:
        return f"{doc['profile']} profile: no records"
    line = (
        f"{doc['profile']} profile; records of commit {', '.join(doc['commits'])}; newest record "
        f"{str(doc['newest_record'] or '')[:19]} by {doc['newest_commit']}"
    )
    if doc["stale"]:
        line += f"; {len(doc['stale'])} metric(s) stale (made by an older commit)"
    if head is not None:
        line += f"; HEAD {head}"
    return line


def build_report(
    folder: Path,
    outcomes: Sequence[dict] = (),
    *,
    run_id: str | None = None,
    title: str = "mahia run report",
    profile: str | None = None,
    head: str | None = None,
) -> str:
    """Markdown report for one device folder and one profile (default: full if it has records, else the
    newest record's; a run's own profile when ``run_id`` is given); restricted to ``run_id``'s records
    when given. ``head``: a commit to compare each headline metric's commit with (e.g. the run's)."""
    df = load_records(folder)
    if run_id is not None and not df.empty:
        df = df[df["run_id"] == run_id]
    if profile is None:
        profile = report_profile(df)
    if not df.empty:
        df = df[df["profile"] == profile]
    doc = headline(folder, profile)
    lines = [f"# {title}", "", f"_{_device_line(df)}_", "", f"_{_commits_line(doc, head)}_", ""]
    if outcomes:
        lines += ["## Notebooks", "", "| notebook | status | time (s) | where it failed |", "|---|---|---|---|"]
        for o in outcomes:
            where = ""
            if o.get("status") != "ok":
                where = o.get("error", "") or ""
                if o.get("cell") is not None:
                    where = f"cell {o['cell']}: {where}"
            lines.append(
                f"| {o['name']} | {o['status']} | {_fmt(o.get('seconds'), '.0f')} | {where.replace('|', '/')[:200]} |"
            )
        lines.append("")
    ps = pairs(df) if not df.empty else []
    lines += ["## Before / after", ""]
    if ps:
        lines += [
            "| notebook | experiment | shape | dtype | before → after | speedup [20–80%] | "
            "fraction of limit | rel. error | verified on |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for p in ps:
            sig = "" if p.significant else " (not significant)"
            frac = f"{p.frac_of_limit:.2f} of {p.limit}" if p.frac_of_limit is not None else "—"
            lines.append(
                f"| {p.notebook} | {p.experiment} | {p.shape or '—'} | {p.dtype or '—'} | "
                f"{p.baseline} → {p.optimized} | {p.speedup:.2f}× [{p.low:.2f}, {p.high:.2f}]{sig} | "
                f"{frac} | {_fmt(p.rel_err, '.1e')} | {p.device}, {p.date} |"
            )
    else:
        lines.append("No before/after pairs were recorded.")
    lines += [
        "",
        f"## Headline metrics ({profile} profile, all its records)",
        "",
        "| key | value | goal | | commit |",
        "|---|---|---|---|---|",
    ]
    for k, v in doc["metrics"].items():
        goal = " ".join(map(str, GOALS[k])) if k in GOALS else ""
        lines.append(
            f"| `{k}` | {_fmt(v, '.4g', 'not measured')} | {goal} | {goal_status(k, v)} | "
            f"{commit_marks(doc, k, head)} |"
        )
    return "\n".join(lines) + "\n"


def _md_to_html(md: str, title: str) -> str:
    """A small Markdown-table-to-HTML rendering (no extra dependency)."""
    out, in_table = [], False
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if all(set(c) <= set("-:") for c in cells):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("# "):
            out.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            out.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("_") and line.endswith("_"):
            out.append(f"<p><em>{html.escape(line.strip('_'))}</em></p>")
        elif line:
            out.append(f"<p>{html.escape(line)}</p>")
    if in_table:
        out.append("</table>")
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px}th{background:#eee}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(out)}</body></html>\n"
    )


def write_report(
    folder: Path, out_dir: Path, outcomes: Sequence[dict] = (), *, run_id: str | None = None, head: str | None = None
) -> tuple[Path, Path]:
    """The run's report in ``out_dir`` (its records, compared with ``head``), every profile's summary
    and the folder's ``report.md`` (full profile when it has records)."""
    write_summaries(folder)
    md = build_report(folder, outcomes, run_id=run_id, head=head)
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    atomic_write_text(md_path, md)
    atomic_write_text(html_path, _md_to_html(md, "mahia run report"))
    atomic_write_text(folder / "report.md", build_report(folder))  # all records of this device
    return md_path, html_path


def readme_table(folder: Path) -> str:
    """Headline metrics of the committed reference (the full profile's ``summary.json``) as a Markdown
    table, with device, date and the commit(s) the records come from; a metric made by an older commit
    than the newest record is marked †."""
    summary = read_summary(folder, "full")
    if "sources" not in summary:
        raise ValueError(f"{folder}/summary.json is in the old format: `python -m mahia report {folder}`")
    df = load_records(folder)
    df = latest(df[df["profile"] == "full"]) if not df.empty else df
    commits = ", ".join(summary["commits"]) or "none"
    lines = [
        f"_{_device_line(df)}; full profile, commit {commits}; generated by `python -m mahia readme`_",
        "",
        "| metric | value | goal | |",
        "|---|---|---|---|",
    ]
    for k in HEADLINE_KEYS:
        v = summary["metrics"].get(k)
        goal = " ".join(map(str, GOALS[k])) if k in GOALS else ""
        stale = " †" if k in summary["stale"] else ""
        lines.append(f"| `{k}` | {_fmt(v, '.4g', 'not measured yet')}{stale} | {goal} | {goal_status(k, v)} |")
    if summary["stale"]:
        older = sorted({c for k in summary["stale"] for c in summary["sources"][k]} - {summary["newest_commit"]})
        lines += [
            "",
            (
                f"† made by an older commit ({', '.join(older)}) than the newest record "
                f"({summary['newest_commit']}): run that part of the reference again"
            ),
        ]
    return "\n".join(lines) + "\n"
