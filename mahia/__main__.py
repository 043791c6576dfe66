"""Command line: ``python -m mahia <command>``.

    run               execute notebooks headlessly (papermill) and write results, figures, report
                      (to runs/, git-ignored)
    reference         write the committed reference data/results/<gpu>/ and figures/<gpu>/: a GPU, a
                      clean tree, the full profile, in parts that resume
    list              list the notebooks
    report            rebuild the summaries and report.md of a device folder from its records
    readme            print (or --write into README.md) the headline table of the committed reference
    commit            print the commit records get here (``MAHIA_COMMIT`` or git's, -dirty if so)
    clean-notebooks   strip outputs from notebooks/*.ipynb (--check: fail if any has outputs)

Bad input gets one clear line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mahia", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="execute notebooks headlessly")
    r.add_argument("--profile", default="auto", help="quick | full | auto (full on a GPU, quick on a CPU)")
    r.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    r.add_argument(
        "--notebooks",
        "-n",
        default=None,
        help="comma-separated numbers or names (e.g. 00,03 or 03_triton_fusion); default all",
    )
    r.add_argument(
        "--out",
        default=None,
        help="folder for executed notebooks and the report (default: a new runs/<date>-<time>-<device>-<profile>/)",
    )
    r.add_argument("--timeout", type=float, default=1800, help="seconds allowed per notebook")
    r.add_argument("--results-dir", default=None, help="results root (default runs/results)")
    r.add_argument("--figures-dir", default=None, help="figures root (default runs/figures)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument(
        "--param",
        "-p",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a notebook parameter, e.g. -p batch=8 -p \"modes=['default']\" (repeatable)",
    )
    f = sub.add_parser("reference", help="write the committed reference (GPU, clean tree, full profile)")
    f.add_argument(
        "--notebooks",
        "-n",
        default=None,
        help="notebooks to run (numbers or names, or all); with neither this nor --bench: everything",
    )
    f.add_argument("--bench", default=None, help="benchmark suites to run: all or e.g. kernels,moe")
    f.add_argument("--device", default="cuda", help="cuda[:N] (a CPU run is never the reference)")
    f.add_argument("--timeout", type=float, default=1800, help="seconds allowed per notebook or suite")
    f.add_argument(
        "--out",
        default=None,
        help="folder for executed notebooks, logs and the run's report "
        "(default: a new runs/<date>-<time>-<device>-reference/)",
    )
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--force", action="store_true", help="run parts already recorded for this commit again")
    f.add_argument(
        "--allow-dirty",
        action="store_true",
        help="run although mahia/ or notebooks/ have uncommitted changes (the records say -dirty)",
    )
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    f.add_argument(
        "--param",
        "-p",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a notebook parameter (recorded in parts/<notebook>.json), repeatable",
    )
    sub.add_parser("list", help="list the notebooks")
    rep = sub.add_parser("report", help="rebuild the summaries and report.md from the records")
    rep.add_argument(
        "folder", nargs="?", default=None, help="device folder (default: every folder of the reference, data/results)"
    )
    rd = sub.add_parser("readme", help="headline table of the committed reference (full profile)")
    rd.add_argument("folder", help="device folder, e.g. data/results/nvidia-h200")
    sub.add_parser("commit", help="print the commit records get here")
    rd.add_argument("--write", action="store_true", help="replace the table between the markers in README.md")
    c = sub.add_parser("clean-notebooks", help="strip outputs from the notebooks")
    c.add_argument("--check", action="store_true", help="only check; exit 1 if any notebook has outputs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from mahia import runner

    try:
        if args.cmd == "run":
            return runner.run(
                profile=args.profile,
                device=args.device,
                notebooks=args.notebooks,
                out=args.out,
                timeout=args.timeout,
                results_dir=args.results_dir,
                figures_dir=args.figures_dir,
                seed=args.seed,
                progress=not args.no_progress,
                params=args.param,
            )
        if args.cmd == "reference":
            return runner.reference(
                notebooks=args.notebooks,
                bench=args.bench,
                device=args.device,
                timeout=args.timeout,
                out=args.out,
                seed=args.seed,
                force=args.force,
                allow_dirty=args.allow_dirty,
                progress=not args.no_progress,
                params=args.param,
            )
        if args.cmd == "commit":
            from mahia.measure.files import run_commit

            print(run_commit())
            return 0
        if args.cmd == "list":
            for nb in runner.list_notebooks():
                print(nb.stem)
            return 0
        if args.cmd == "report":
            return _report(Path(args.folder) if args.folder else None)
        if args.cmd == "readme":
            return _readme(Path(args.folder), args.write)
        if args.cmd == "clean-notebooks":
            dirty = [nb for nb in runner.list_notebooks() if not runner.notebook_is_clean(nb)]
            if args.check:
                for nb in dirty:
                    print(f"{nb}: committed with outputs; run `python -m mahia clean-notebooks`", file=sys.stderr)
                return 1 if dirty else 0
            for nb in dirty:
                runner.clean_notebook(nb)
                print(f"cleaned {nb}")
            return 0
    except runner.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 2


def _report(folder: Path | None) -> int:
    """Every profile's summary and report.md of one device folder (default: each reference folder); says
    which commit(s) the full profile's metrics come from and which were not made by HEAD."""
    from mahia.measure import files
    from mahia.measure.report import build_report, commit_marks
    from mahia.measure.results import headline, write_summaries
    from mahia.runner import UsageError

    root = files.reference_results_dir()
    if folder is not None:
        folders = [folder]
    else:
        folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not folders:
        raise UsageError(f"no results folder in {root}; name one, e.g. runs/results/<device>")
    head = files.git_commit()
    for f in folders:
        if not f.is_dir():
            raise UsageError(f"no such results folder: {f}")
        written = write_summaries(f)
        files.atomic_write_text(f / "report.md", build_report(f))
        print(f"{f}: {', '.join(files.profile_file(f, 'summary', p).name for p in written)}, report.md")
        for p in written:
            doc = headline(f, p)
            not_head = [k for k in doc["sources"] if any(c != head for c in doc["sources"][k])]
            print(
                f"  {p} profile: commit {', '.join(doc['commits']) or 'none'}; newest record "
                f"{str(doc['newest_record'] or '')[:19]} by {doc['newest_commit']}; HEAD is {head}"
            )
            for k in doc["stale"]:
                print(f"    stale: {k} ({commit_marks(doc, k)})")
            if not_head:
                print(f"    {len(not_head)} of {len(doc['sources'])} measured metric(s) not made by HEAD")
    return 0


BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"


def _readme(folder: Path, write: bool) -> int:
    from mahia.measure.files import REPO_ROOT
    from mahia.measure.report import readme_table
    from mahia.measure.results import load_records, write_summary
    from mahia.runner import UsageError

    if not folder.is_dir():
        raise UsageError(f"no such results folder: {folder}")
    df = load_records(folder)
    if df.empty or not (df["profile"] == "full").any():
        raise UsageError(
            f"{folder} has no full-profile records: the README shows the reference "
            "(`python -m mahia reference` on a GPU)"
        )
    write_summary(folder, "full")
    table = readme_table(folder)
    if not write:
        print(table, end="")
        return 0
    readme = REPO_ROOT / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise UsageError(f"README.md has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{table}{END}{tail}")
    print(f"README.md: headline table from {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
