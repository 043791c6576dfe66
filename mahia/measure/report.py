"""The run report and the README's generated blocks, from the records (never typed in).

``build_report``: a run's notebooks (status, time, slowest cells, where one failed), its before/after pairs
and the headline metrics. A pair is a baseline and an optimized row of one experiment and shape: of one dtype
where the experiment has a baseline in it, else across dtypes (06's fp32 → bf16, 10's ladder); its speedup's
spread crosses the 20th and 80th percentiles. A CPU run is not graded against the (H100/H200) goals.
``readme_tables`` and ``render_runs_block``: the headline metrics of the reference folders, a column per GPU,
and the wall time of each part (``parts/*.json``).
"""

from __future__ import annotations

import html
import json
import re
import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from mahia.measure.files import atomic_write_text
from mahia.measure.summary import (
    GOALS,
    HEADLINE_KEYS,
    goal_status,
    headline,
    latest,
    load_records,
    profiles,
    read_summary,
    write_summaries,
)

__all__ = ["build_report", "write_report", "report_pairs", "grade", "reference_parts", "readme_tables"]
__all__ += ["parts_table", "render_runs_block", "RUNS_BEGIN", "RUNS_END"]

CPU_NOT_GRADED = "not graded (CPU run)"
ABOVE_ONE = (
    "↑ Above 1 of a ceiling: the ceilings are measurements on this device (one large copy; the best of a few "
    "large square matmuls), not hardware limits; a shape or cache that suits a kernel better can pass them."
)


def _fmt(x, spec=".3g", none="—"):
    return none if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def _table(header: Sequence[str], rows: Sequence[Sequence]) -> list[str]:
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header), *(f"| {' | '.join(map(str, r))} |" for r in rows)]


def _is_cpu(df: pd.DataFrame, folder: Path | None = None) -> bool:
    """True when every record's device slug is a CPU's, or, without records, the folder is a CPU's."""
    slugs = [str(x) for x in df["device_slug"].dropna()] if not df.empty else []
    return all(x.startswith("cpu") for x in slugs) if slugs else bool(folder and Path(folder).name.startswith("cpu"))


def grade(key: str, value: float | None, *, cpu: bool) -> str:
    """``goal_status`` of a headline value; on a CPU a measured value is reported, not graded."""
    return CPU_NOT_GRADED if cpu and key in GOALS and value is not None else goal_status(key, value)


def _natural(text: str) -> tuple:
    """A sort key that orders the numbers in a shape by value: 4x256 before 4x1024."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.findall(r"\d+|\D+", text))


def report_pairs(df: pd.DataFrame) -> pd.DataFrame:
    """Every optimized row of the newest records with its baseline (same experiment and shape; the optimized
    row's dtype where the experiment has a baseline in it, else its newest baseline), sorted by notebook,
    experiment and shape. ``speedup`` is base / opt median; ``low``, ``high`` the crossed p20 and p80 ratios."""
    rows = []
    df = latest(df) if not df.empty else df
    df = df[df["median_ms"].notna()] if not df.empty else df
    for (exp, shape), g in df.groupby(["experiment", "shape"], sort=False) if not df.empty else []:
        base = g[g["role"] == "baseline"].sort_values("date")
        for _, o in g[g["role"] == "optimized"].iterrows():
            if base.empty:
                continue
            same = base[base["dtype"] == o["dtype"]]
            b = (same if not same.empty else base).iloc[-1]
            rows.append(
                {
                    "notebook": o["notebook"],
                    "experiment": exp,
                    "shape": shape,
                    "dtype": o["dtype"] if b["dtype"] == o["dtype"] else f"{b['dtype']} → {o['dtype']}",
                    "pair": f"{b['variant']} → {o['variant']}",
                    "speedup": b["median_ms"] / o["median_ms"],
                    "low": b["p20_ms"] / o["p80_ms"],
                    "high": b["p80_ms"] / o["p20_ms"],
                    "frac_of_limit": o["frac_of_limit"],
                    "limit": o["limit"],
                    "rel_err": o["rel_err"],
                    "date": str(o["date"])[:10],
                    "run": o["run_id"] if b["run_id"] == o["run_id"] else f"{o['run_id']} (before: {b['run_id']})",
                    "commit": o["commit"] if b["commit"] == o["commit"] else f"{o['commit']} (before: {b['commit']})",
                }
            )
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["significant"] = ~((out["low"] <= 1) & (1 <= out["high"]))
    key = [(r.notebook, r.experiment, _natural(r.shape), r.dtype) for r in out.itertuples()]
    return out.iloc[sorted(range(len(out)), key=key.__getitem__)].reset_index(drop=True)


def _frac(p) -> str:
    if pd.isna(p.frac_of_limit):
        return "—"
    return f"{p.frac_of_limit:.3f} ↑ of {p.limit}" if p.frac_of_limit > 1 else f"{p.frac_of_limit:.2f} of {p.limit}"


def build_report(
    folder: Path, outcomes: Sequence[dict] = (), *, run_id: str | None = None, head: str | None = None
) -> str:
    """The Markdown report of a device folder's records (``run_id``'s only when given) in one profile: full
    when it has records, else the newest record's. ``head``: the commit the run was made from."""
    df = load_records(folder)
    if run_id is not None and not df.empty:
        df = df[df["run_id"] == run_id]
    found = profiles(df)
    profile = "full" if not found or "full" in found else str(df.sort_values("date")["profile"].iloc[-1])
    df = df[df["profile"] == profile] if not df.empty else df
    doc, cpu = headline(folder, profile), _is_cpu(df, folder)
    when = f"{', '.join(sorted(set(df['device'].dropna().astype(str))))}, {str(df['date'].max())[:10]}"
    lines = [
        "# mahia run report",
        "",
        f"_{when if not df.empty else 'no records'}; {profile} profile of `{Path(folder).name}`; records of commit "
        f"{', '.join(doc['commits']) or 'none'}" + (f"; run {run_id} from {head}" if run_id else "") + "_",
        "",
        "Generated from the records by `mahia.measure.report`: every notebook times a *before* path (role "
        "`baseline`) and an *after* path (`optimized`) on the same inputs, after checking they agree.",
        "",
    ]
    if cpu:
        lines += ["**A CPU run.** Its numbers describe this CPU; the goals are an H100/H200's: not graded.", ""]
    if run_id is not None and df.empty:
        lines += [f"_No notebook or suite of run {run_id} recorded anything: see each part's status and log._", ""]
    if outcomes:
        rows = []
        for o in outcomes:
            where = "" if o.get("status") == "ok" else str(o.get("error", "") or "")
            if where and o.get("cell") is not None:
                where = f"cell {o['cell']}: {where}"
            slow = ", ".join(f"{c['cell']}: {c['seconds']:.0f}" for c in o.get("slowest_cells") or [])
            rows.append((o["name"], o["status"], _fmt(o.get("seconds"), ".0f"), slow, where.replace("|", "/")[:200]))
        lines += [
            "## Notebooks",
            "",
            *_table(("notebook", "status", "time (s)", "slowest cells (s)", "where it failed"), rows),
            "",
        ]
    pairs = report_pairs(df)
    lines += ["## Before / after", ""]
    for nb, g in pairs.groupby("notebook", sort=False) if not pairs.empty else []:
        header = ("experiment", "shape", "dtype", "before → after", "speedup [20–80%]", "fraction of limit")
        header += ("rel. error", "date", "run", "commit")
        rows = [
            (
                p.experiment,
                p.shape or "—",
                p.dtype or "—",
                p.pair,
                f"{p.speedup:.2f}× [{p.low:.2f}, {p.high:.2f}]" + ("" if p.significant else " (not significant)"),
                _frac(p),
                _fmt(p.rel_err, ".1e"),
                p.date,
                p.run,
                p.commit,
            )
            for p in g.itertuples()
        ]
        lines += [f"### {nb}", "", *_table(header, rows), ""]
    if pairs.empty:
        lines += ["No before/after pairs were recorded.", ""]
    elif (pairs["frac_of_limit"] > 1).any():
        lines += [ABOVE_ONE, ""]
    rows = [
        (f"`{k}`", _fmt(v, ".4g", "not measured"), " ".join(map(str, GOALS.get(k, ()))), grade(k, v, cpu=cpu))
        for k, v in doc["metrics"].items()
    ]
    lines += [
        f"## Headline metrics ({profile} profile, all its records)",
        "",
        *_table(("key", "value", "goal", ""), rows),
    ]
    return "\n".join(lines) + "\n"


def _md_to_html(md: str, title: str) -> str:
    """The report as a page (mistune, nbconvert's Markdown renderer, with tables)."""
    import mistune

    style = "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}"
    body = mistune.create_markdown(plugins=["table"])(md)
    return f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style>{body}\n"


def write_report(
    folder: Path, out_dir: Path, outcomes: Sequence[dict] = (), *, run_id: str | None = None, head: str | None = None
) -> Path:
    """The run's report.md and report.html in ``out_dir``; when the folder has records, also every profile's
    summary and the folder's own report.md (all its records)."""
    if folder.is_dir() and not load_records(folder).empty:
        write_summaries(folder)
        atomic_write_text(folder / "report.md", build_report(folder))
    md = build_report(folder, outcomes, run_id=run_id, head=head)
    atomic_write_text(out_dir / "report.md", md)
    atomic_write_text(out_dir / "report.html", _md_to_html(md, "mahia run report"))
    return out_dir / "report.md"


# -- the README: headline metrics of every GPU, and how long each part of the reference took ---------------------
RUNS_BEGIN, RUNS_END = "<!-- runs:begin -->", "<!-- runs:end -->"
_GENERATED = "generated by `python -m mahia readme --write`"


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=104, break_long_words=False, break_on_hyphens=False)


def reference_parts(folder: Path) -> list[dict]:
    """The ``parts/<part>.json`` documents of a reference folder (part, commit, seconds...), by part name."""
    return [{"part": p.stem, **json.loads(p.read_text())} for p in sorted((Path(folder) / "parts").glob("*.json"))]


def _per_commit(parts: list[dict]) -> str:
    return ", ".join(f"{n} at {c}" for c, n in sorted(Counter(str(p.get("commit")) for p in parts).items()))


def _value(v: float) -> str:
    """4 significant digits, without an exponent for a large value (16384, not 1.638e+04)."""
    return f"{v:.0f}" if "e+" in format(v, ".4g") else format(v, ".4g")


def readme_tables(folders: Sequence[Path]) -> str:
    """The headline metrics of the reference folders (each one's full-profile ``summary.json``) as one table, a
    column per GPU, each value with its grade and † when an older commit than the folder's newest record made it;
    above it a line per GPU (the days of its records, its commits and parts), below it the † notes."""
    lines, cols = [], []
    for folder in map(Path, folders):
        summary, df = read_summary(folder, "full"), load_records(folder)
        df = latest(df[df["profile"] == "full"]) if not df.empty else df
        cols.append((summary, _is_cpu(df, folder)))
        days = sorted({str(d)[:10] for d in df["date"].dropna()}) if not df.empty else []
        days = days or [str(summary["newest_record"])[:10]] if summary.get("newest_record") else days
        parts = reference_parts(folder)
        line = (
            f"_{summary.get('device') or folder.name} (`{folder.name}`): records of {', '.join(days) or 'no date'}; "
            f"full profile, commit {', '.join(summary.get('commits', [])) or 'none'}"
        )
        line += f"; {len(parts)} part(s) recorded ({_per_commit(parts)})" if parts else ""
        lines += [_wrap(line + (" (a CPU run: timings say nothing about a GPU)" if cols[-1][1] else "") + "_"), ""]
    # A column made by another commit than the newest reference's is stale as a whole (remade when that GPU is lent).
    ref = max((s for s, _ in cols), key=lambda s: str(s.get("newest_record") or ""), default={})
    old = [s for s, _ in cols if s.get("newest_commit") != ref.get("newest_commit")]
    rows = []
    for k in HEADLINE_KEYS:
        cells = []
        for summary, cpu in cols:
            v = summary["metrics"].get(k)
            g = grade(k, v, cpu=cpu) if v is not None else ""
            stale = " †" if k in summary.get("stale", []) else ""
            cells.append("not measured" if v is None else _value(v) + stale + (f" ({g})" if g else ""))
        rows.append((f"`{k}`", " ".join(map(str, GOALS.get(k, ()))), *cells))
    head = ("metric", "goal", *(f"{s.get('device')}{' (stale)' if s in old else ''}" for s, _ in cols))
    lines += [f"_{_GENERATED}; † made by an older commit than that GPU's newest record_", "", *_table(head, rows)]
    for s, _ in cols:
        if s.get("stale"):
            older = sorted({c for k in s["stale"] for c in s["sources"][k]} - {s["newest_commit"]})
            note = f"† {s.get('device')}: made by an older commit ({', '.join(older)}) than its newest record "
            lines += ["", _wrap(note + f"({s['newest_commit']}): run that part of the reference again")]
    for s in old:
        note = f"(stale) {s.get('device')}: commit {s.get('newest_commit')}, not the newest reference's"
        lines += ["", _wrap(note + f" ({ref.get('newest_commit')}, {ref.get('device')}): remade when that GPU is lent")]
    return "\n".join(lines) + "\n"


def _duration(seconds: float) -> str:
    s = round(seconds)
    return (
        f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s" if s < 3600 else f"{s // 3600} h {s % 3600 // 60:02d} min"
    )


def _runs_of_part(folder: Path, part: dict) -> int:
    """How many runs made the records of ``part``'s commit in ``<folder>/<part>.csv`` (1 when unknown)."""
    path = folder / f"{part['part']}.csv"
    if not path.exists():
        return 1
    df = pd.read_csv(path, usecols=["commit", "run_id"], dtype=str)
    return max(1, df.loc[df["commit"] == str(part.get("commit")), "run_id"].nunique())


def _device_name(folder: Path) -> str:
    try:
        return str(read_summary(folder, "full").get("device") or folder.name)
    except (FileNotFoundError, ValueError):
        return folder.name


def parts_table(folders: Sequence[Path]) -> str:
    """The wall time of each part of the reference folders' ``parts/``, a column per GPU, with the total and the
    commits; ‡ marks a part whose records come from several runs (a resumed sweep)."""
    cols = [(Path(f), {p["part"]: p for p in reference_parts(f)}) for f in folders]
    have = [(f, ps) for f, ps in cols if ps]
    lines = []
    if have:
        names = sorted({n for _, ps in have for n in ps}, key=lambda n: (n.startswith("bench_"), n))
        runs = [{n: _runs_of_part(f, p) for n, p in ps.items()} for f, ps in have]
        rows = [
            (
                f"`{n}`",
                *(
                    f"{float(ps[n]['seconds']):.0f}" + (f" ‡ ({r[n]} runs)" if r[n] > 1 else "") if n in ps else "—"
                    for (_, ps), r in zip(have, runs)
                ),
            )
            for n in names
        ]
        totals = [sum(float(p.get("seconds") or 0) for p in ps.values()) for _, ps in have]
        rows.append(("**total**", *(f"**{t:.0f}** ({_duration(t)})" for t in totals)))
        rows.append(("commit(s)", *(_per_commit(list(ps.values())) for _, ps in have)))
        lines = _table(("part (full profile, s)", *(_device_name(f) for f, _ in have)), rows)
        if any(n > 1 for r in runs for n in r.values()):
            note = (
                "‡ resumed: the part's records of its commit come from several runs (the kernel sweep goes on "
                "where a stopped run left it); the seconds, and the total, count its last run only."
            )
            lines += ["", _wrap(note)]
    for f, ps in cols:
        if not ps:
            lines += ([""] if lines else []) + [
                f"{_device_name(f)}: no `parts/` in `{f.name}/`, so no wall time per part."
            ]
    return "\n".join(lines) + "\n" if lines else "No reference folder.\n"


def render_runs_block(folders: Sequence[Path]) -> str:
    """The README's block of run timings (markers excluded)."""
    intro = (
        "Wall time of each part of the committed reference (full profile, `python -m mahia reference`), in "
        "seconds, from its `parts/<part>.json`:"
    )
    return f"_{_GENERATED} from `data/results/<gpu>/parts/*.json`_\n\n{_wrap(intro)}\n\n{parts_table(folders)}"
