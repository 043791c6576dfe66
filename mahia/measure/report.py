"""The run report: one row per before/after pair, generated from the records (never typed in).

Written as Markdown and HTML beside the executed notebooks, and as ``report.md`` in the device's results
folder. A pair is a baseline and an optimized row of one experiment and shape: of one dtype where the
experiment has a baseline in it, else across dtypes, when the change of precision is the optimization
(06's fp32 → bf16, 10's ladder). A CPU run's headline metrics are not graded against the (GPU) goals.
``readme_tables`` renders the headline metrics of the reference folders, a column per GPU, and
``render_runs_block`` the wall time of each part, for the README. A metric is *stale* when another commit
than the profile's newest record made it, *not HEAD* when a ``head`` commit is given and differs.
"""

from __future__ import annotations

import html
import json
import re
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from mahia.measure.files import atomic_write_text, same_commit
from mahia.measure.results import (
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

__all__ = [
    "ReportPair",
    "build_report",
    "write_report",
    "readme_tables",
    "reference_parts",
    "parts_table",
    "render_runs_block",
    "RUNS_BEGIN",
    "RUNS_END",
    "report_pairs",
    "report_profile",
    "commit_marks",
    "grade",
]


def _fmt(x, spec=".3g", none="—"):
    if x is None or (isinstance(x, float) and x != x):
        return none
    return format(x, spec)


def _is_cpu(df: pd.DataFrame, folder: Path | None = None) -> bool:
    """True when the records are a CPU's (every device slug starts with 'cpu'), or, without records, when the
    device folder is a CPU's."""
    slugs = [str(x) for x in df["device_slug"].dropna()] if "device_slug" in df and not df.empty else []
    if slugs:
        return all(x.startswith("cpu") for x in slugs)
    return folder is not None and Path(folder).name.startswith("cpu")


def _device_line(df: pd.DataFrame) -> str:
    if df.empty:
        return "no records"
    devs = sorted(set(df["device"].dropna().astype(str)))
    date = str(df["date"].max())[:10]
    note = " (a CPU run: timings say nothing about a GPU)" if _is_cpu(df) else ""
    return f"verified on {', '.join(devs)}, {date}{note}"


CPU_NOT_GRADED = "not graded (CPU run)"


def grade(key: str, value: float | None, *, cpu: bool) -> str:
    """``goal_status`` of a headline value, except on a CPU: the goals are an H100/H200's, so a CPU run's
    value is reported and not graded."""
    if cpu and key in GOALS and value is not None:
        return CPU_NOT_GRADED
    return goal_status(key, value)


@dataclass
class ReportPair:
    """One row of the before/after table: the baseline and one optimized row of an experiment and shape."""

    notebook: str
    experiment: str
    shape: str
    dtype: str  # the optimized row's
    base_dtype: str
    baseline: str
    optimized: str
    speedup: float
    low: float
    high: float
    frac_of_limit: float | None
    limit: str | None
    rel_err: float | None
    date: str
    run_id: str
    commit: str
    base_run_id: str
    base_commit: str

    @property
    def significant(self) -> bool:
        return not (self.low <= 1.0 <= self.high)

    @property
    def above_ceiling(self) -> bool:
        return self.frac_of_limit is not None and self.frac_of_limit > 1.0


def _str(v) -> str:
    return "" if v is None or (isinstance(v, float) and v != v) else str(v)


def report_pairs(df: pd.DataFrame) -> list[ReportPair]:
    """Every optimized row of the newest records (``latest``) with its baseline: the same experiment and
    shape, and the baseline of the optimized row's dtype when the experiment has one there, else the
    experiment's newest baseline of another dtype (a change of precision as the optimization). The speedup's
    spread is [base.p20 / opt.p80, base.p80 / opt.p20]."""
    out: list[ReportPair] = []
    if df.empty:
        return out
    df = latest(df)
    df = df[df["median_ms"].notna()]
    for (exp, shape), g in df.groupby(["experiment", "shape"], sort=False):
        base, opt = g[g["role"] == "baseline"], g[g["role"] == "optimized"]
        if base.empty or opt.empty:
            continue
        for _, o in opt.iterrows():
            same = base[base["dtype"] == o["dtype"]]
            b = (same if not same.empty else base).sort_values("date").iloc[-1]
            out.append(
                ReportPair(
                    notebook=str(o["notebook"]),
                    experiment=str(exp),
                    shape=_str(shape),
                    dtype=_str(o["dtype"]),
                    base_dtype=_str(b["dtype"]),
                    baseline=str(b["variant"]),
                    optimized=str(o["variant"]),
                    speedup=b["median_ms"] / o["median_ms"],
                    low=b["p20_ms"] / o["p80_ms"],
                    high=b["p80_ms"] / o["p20_ms"],
                    frac_of_limit=None if pd.isna(o["frac_of_limit"]) else float(o["frac_of_limit"]),
                    limit=None if pd.isna(o["limit"]) or not str(o["limit"]) else str(o["limit"]),
                    rel_err=None if pd.isna(o["rel_err"]) else float(o["rel_err"]),
                    date=str(o["date"])[:10],
                    run_id=_str(o.get("run_id")),
                    commit=_str(o.get("commit")),
                    base_run_id=_str(b.get("run_id")),
                    base_commit=_str(b.get("commit")),
                )
            )
    return sorted(out, key=lambda p: (p.notebook, p.experiment, _natural(p.shape), p.dtype, p.optimized))


def _natural(text: str) -> tuple:
    """A sort key that orders the numbers in a shape by value: 4x256 before 4x1024."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.findall(r"\d+|\D+", text))


INTRO = (
    "Generated from the result records of one device folder by `mahia.measure.report`; no number here is "
    "typed in. Every notebook (and benchmark) times a *before* path (role `baseline`) and an *after* path "
    "(role `optimized`) on the same inputs, after checking that they compute the same function; peers (other "
    "libraries, other modes) are in the records and the notebooks, not here."
)
PAIR_COLUMNS = [
    "**experiment**, **shape**: what was timed, at which size (the notebook's notation).",
    "**dtype**: the compute dtype; `before → after` when the change of precision is the optimization (a pair "
    "is of one dtype wherever the experiment has a baseline in it).",
    "**before → after**: the baseline and the optimized variant.",
    "**speedup [20–80%]**: baseline median time over optimized median time; in brackets the same ratio of the "
    "crossed 20th and 80th percentiles (slowest after against fastest before, and the reverse). *not "
    "significant* when that range contains 1.",
    "**fraction of limit**: the optimized path's GB/s or TFLOP/s over the ceiling of this device measured at "
    "set-up (`copy`, `matmul_bf16`, `matmul_fp32`); ↑ marks a value above 1 (see the note below the tables).",
    "**rel. error**: norm-wise relative error of the optimized output against the notebook's reference.",
    "**date**, **run**, **commit**: when the optimized row was recorded, by which run (`run_id`), and the "
    "commit of the code (`-dirty`: uncommitted changes; `unknown`: no git). A baseline from another run or "
    "commit is named after it.",
]
ABOVE_ONE = (
    "↑ Above 1 of a ceiling: the ceilings are measurements on this device (one large copy; the best of a few "
    "large square matmuls), not hardware limits. A kernel exceeds one when its shape suits the library better "
    "than the ceiling's shapes, when its bytes come from a cache the ceiling's copy is too large for, or when "
    "the ceiling was measured while the machine was busy with other work; on a CPU, a ceiling measured at one "
    "size bounds other sizes only loosely."
)
HEADLINE_COLUMNS = (
    "**value**: the metric, computed from the newest records by its rule (`mahia.measure.results.HEADLINES`); "
    "**goal**: the project's goal on an H100/H200 (README); the next column: met or missed, *not graded* on a "
    "CPU; **commit**: the commit(s) whose records made the value (*stale*: older than the newest record; "
    "*not HEAD*: not the commit this report was made for)."
)


def _frac(p: ReportPair) -> str:
    if p.frac_of_limit is None:
        return "—"
    if p.above_ceiling:
        return f"{p.frac_of_limit:.3f} ↑ of {p.limit}"
    return f"{p.frac_of_limit:.2f} of {p.limit}"


def _with_base(opt: str, base: str) -> str:
    return opt if base == opt or not base else f"{opt} (before: {base})"


def _pair_lines(ps: list[ReportPair]) -> list[str]:
    lines = ["## Before / after", "", *[f"- {c}" for c in PAIR_COLUMNS], ""]
    if not ps:
        return [*lines, "No before/after pairs were recorded."]
    for nb in dict.fromkeys(p.notebook for p in ps):
        lines += [
            f"### {nb}",
            "",
            "| experiment | shape | dtype | before → after | speedup [20–80%] | fraction of limit | rel. error | "
            "date | run | commit |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p in (q for q in ps if q.notebook == nb):
            sig = "" if p.significant else " (not significant)"
            dt = p.dtype if p.base_dtype == p.dtype else f"{p.base_dtype} → {p.dtype}"
            lines.append(
                f"| {p.experiment} | {p.shape or '—'} | {dt or '—'} | {p.baseline} → {p.optimized} | "
                f"{p.speedup:.2f}× [{p.low:.2f}, {p.high:.2f}]{sig} | {_frac(p)} | {_fmt(p.rel_err, '.1e')} | "
                f"{p.date} | {_with_base(p.run_id, p.base_run_id)} | {_with_base(p.commit, p.base_commit)} |"
            )
        lines.append("")
    if any(p.above_ceiling for p in ps):
        lines.append(ABOVE_ONE)
    while lines[-1] == "":
        lines.pop()
    return lines


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
    if head is not None and any(not same_commit(c, head) for c in cs):
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
    cpu = _is_cpu(df, folder)
    scope = f"the records of run `{run_id}`" if run_id is not None else "all its records"
    lines = [
        f"# {title}",
        "",
        f"_{_device_line(df)}_",
        "",
        f"_{_commits_line(doc, head)}_",
        "",
        f"{INTRO} This report shows the {profile} profile of `{Path(folder).name}`, {scope}.",
        "",
    ]
    if cpu:
        lines += [
            "**A CPU run.** Its speedups describe this CPU, where nothing runs asynchronously and there are no "
            "tensor cores; the project's goals are an H100/H200's, so its headline metrics are not graded.",
            "",
        ]
    if outcomes:
        lines += [
            "## Notebooks",
            "",
            "| notebook | status | time (s) | slowest cells (s) | where it failed |",
            "|---|---|---|---|---|",
        ]
        for o in outcomes:
            where = ""
            if o.get("status") != "ok":
                where = o.get("error", "") or ""
                if o.get("cell") is not None:
                    where = f"cell {o['cell']}: {where}"
            slow = _slowest_text(o.get("slowest_cells"))
            lines.append(
                f"| {o['name']} | {o['status']} | {_fmt(o.get('seconds'), '.0f')} | {slow} | "
                f"{where.replace('|', '/')[:200]} |"
            )
        lines.append("")
    lines += _pair_lines(report_pairs(df))
    lines += [
        "",
        f"## Headline metrics ({profile} profile, all its records)",
        "",
        HEADLINE_COLUMNS,
        "",
        "| key | value | goal | | commit |",
        "|---|---|---|---|---|",
    ]
    above = False
    for k, v in doc["metrics"].items():
        goal = " ".join(map(str, GOALS[k])) if k in GOALS else ""
        up = " ↑" if "frac" in k and v is not None and v > 1 else ""
        above = above or bool(up)
        lines.append(
            f"| `{k}` | {_fmt(v, '.4g', 'not measured')}{up} | {goal} | {grade(k, v, cpu=cpu)} | "
            f"{commit_marks(doc, k, head)} |"
        )
    if above:
        lines += ["", ABOVE_ONE]
    return "\n".join(lines) + "\n"


def _md_to_html(md: str, title: str) -> str:
    """The report as a page: mistune (nbconvert's Markdown renderer) with tables."""
    import mistune

    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px}th{background:#eee}"
    )
    body = mistune.create_markdown(plugins=["table"])(md)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{body}</body></html>\n"
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


# -- the README: headline metrics of every GPU, and how long runs took ------------------------------------
RUNS_BEGIN, RUNS_END = "<!-- runs:begin -->", "<!-- runs:end -->"
WIDTH = 104  # the README's prose is wrapped near this
_GENERATED = "generated by `python -m mahia readme --write`"


def _latest_full(folder: Path) -> pd.DataFrame:
    """The newest full-profile record of each key of a device folder: what its ``summary.json`` is made of."""
    df = load_records(folder)
    return latest(df[df["profile"] == "full"]) if not df.empty else df


def _record_days(df: pd.DataFrame, summary: dict) -> list[str]:
    """The days (UTC) of the full-profile records ``df`` (``_latest_full``) a summary is made of (its newest
    record's without any)."""
    days = sorted({str(d)[:10] for d in df["date"].dropna()}) if not df.empty else []
    return days or ([str(summary["newest_record"])[:10]] if summary.get("newest_record") else [])


def reference_parts(folder: Path) -> list[dict]:
    """The ``parts/<part>.json`` documents of a reference folder (part, commit, seconds...), by part name;
    empty when it has none (a reference made before parts were recorded)."""
    docs = []
    for path in sorted((Path(folder) / "parts").glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(doc, dict):
            docs.append({"part": path.stem, **doc})
    return docs


def _parts_per_commit(parts: list[dict]) -> str:
    per = Counter(str(p.get("commit")) for p in parts)
    return ", ".join(f"{n} at {c}" for c, n in sorted(per.items()))


def _older(summary: dict) -> list[str]:
    return sorted({c for k in summary["stale"] for c in summary["sources"][k]} - {summary["newest_commit"]})


def readme_tables(folders: Sequence[Path]) -> str:
    """Headline metrics of several reference folders (each one's full-profile ``summary.json``) as one
    Markdown table, a column per GPU in the order given: each cell the value, † when it was made by an
    older commit than that folder's newest record, and its grade. Above it one line per GPU (device, the
    days of its records, the commit(s), the parts recorded per commit); below it the † note per GPU."""
    cols = []
    for folder in map(Path, folders):
        summary, df = read_summary(folder, "full"), _latest_full(folder)  # the records read once per folder
        cols.append((folder, summary, _is_cpu(df, folder), _record_days(df, summary)))
    lines = []
    for folder, summary, cpu, folder_days in cols:
        parts = reference_parts(folder)
        line = (
            f"_{summary.get('device') or folder.name} (`{folder.name}`): records of "
            f"{', '.join(folder_days) or 'no date'}; full profile, commit "
            f"{', '.join(summary['commits']) or 'none'}"
        )
        if parts:
            line += f"; {len(parts)} part(s) recorded ({_parts_per_commit(parts)})"
        if cpu:
            line += " (a CPU run: timings say nothing about a GPU)"
        lines += [_wrap(line + "_"), ""]
    lines += [
        f"_{_GENERATED}; † made by an older commit than that GPU's newest record_",
        "",
        "| metric | goal | " + " | ".join(str(s.get("device") or f.name) for f, s, *_ in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for k in HEADLINE_KEYS:
        goal = " ".join(map(str, GOALS[k])) if k in GOALS else ""
        cells = []
        for _, summary, cpu, _ in cols:
            v = summary["metrics"].get(k)
            if v is None:
                cells.append("not measured")
                continue
            g = grade(k, v, cpu=cpu)
            stale = " †" if k in summary["stale"] else ""
            cells.append(f"{_value(v)}{stale}" + (f" ({g})" if g else ""))
        lines.append(f"| `{k}` | {goal} | " + " | ".join(cells) + " |")
    notes = [
        f"† {s.get('device') or f.name}: made by an older commit ({', '.join(_older(s))}) than its newest record "
        f"({s['newest_commit']}): run that part of the reference again"
        for f, s, *_ in cols
        if s["stale"]
    ]
    for n in notes:
        lines += ["", _wrap(n).rstrip("\n")]
    return "\n".join(lines) + "\n"


def _value(v: float) -> str:
    """4 significant digits, without an exponent for a large value (16384, not 1.638e+04)."""
    text = _fmt(v, ".4g")
    return f"{v:.0f}" if "e+" in text else text


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, width=WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


def _slowest_text(cells, unit: str = "") -> str:
    """'33: 27, 42: 19' from a part's ``slowest_cells`` (cell number: seconds, each followed by ``unit``); ''
    without them."""
    if not isinstance(cells, list):
        return ""
    return ", ".join(
        f"{c['cell']}: {c['seconds']:.0f}{unit}" for c in cells if isinstance(c, dict) and {"cell", "seconds"} <= set(c)
    )


def format_duration(seconds: float) -> str:
    """``48 s``, ``13 min 11 s``, ``1 h 02 min``."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _secs(x: float) -> str:
    return f"{x:.0f}"


def parts_table(folders: Sequence[Path]) -> str:
    """The wall time of each part (notebook, ``bench_<suite>``) of the reference folders' ``parts/``, a
    column per GPU, with the total and the commit(s); a line for each folder without parts."""
    cols = [(Path(f), reference_parts(f)) for f in folders]
    have = [(f, ps) for f, ps in cols if ps]
    lines = []
    if have:
        rows = sorted({p["part"] for _, ps in have for p in ps}, key=lambda n: (n.startswith("bench_"), n))
        lines += [
            "| part (full profile, s) | " + " | ".join(_device_name(f) for f, _ in have) + " |",
            "|---|" + "---|" * len(have),
        ]
        by = [{p["part"]: p for p in ps} for _, ps in have]
        runs = [{name: _runs_of_part(f, p) for name, p in b.items()} for (f, _), b in zip(have, by)]
        for r in rows:
            lines.append(f"| `{r}` | " + " | ".join(_part_cell(b.get(r), n.get(r, 1)) for b, n in zip(by, runs)) + " |")
        totals = [sum(float(p.get("seconds") or 0) for p in ps) for _, ps in have]
        lines.append("| **total** | " + " | ".join(f"**{_secs(t)}** ({format_duration(t)})" for t in totals) + " |")
        lines.append("| commit(s) | " + " | ".join(_parts_per_commit(ps) for _, ps in have) + " |")
        if any(n > 1 for ns in runs for n in ns.values()):
            note = (
                "‡ resumed: the part's records of its commit come from several runs (the kernel sweep goes on "
                "where a stopped run left it); the seconds, and the total, count its last run only."
            )
            lines += ["", _wrap(note).rstrip("\n")]
    for f, ps in cols:
        if not ps:
            lines += ([""] if lines else []) + [
                f"{_device_name(f)}: no `parts/` in `{f.name}/`, so no wall time per part."
            ]
    return "\n".join(lines) + "\n" if lines else "No reference folder.\n"


def _part_cell(part: dict | None, runs: int) -> str:
    """A part's seconds, marked ‡ when its records come from several runs."""
    if part is None:
        return "—"
    return _secs(float(part["seconds"])) + (f" ‡ ({runs} runs)" if runs > 1 else "")


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


def render_runs_block(folders: Sequence[Path]) -> str:
    """The README's block of run timings (markers excluded): the reference folders' parts (``parts_table``)."""
    out = [
        f"_{_GENERATED} from `data/results/<gpu>/parts/*.json`_",
        "",
        _wrap(
            "Wall time of each part of the committed reference (full profile, `python -m mahia reference`), in "
            "seconds, from its `parts/<part>.json`:"
        ),
        "",
        parts_table(folders).rstrip("\n"),
    ]
    return "\n".join(out) + "\n"
