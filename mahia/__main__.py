"""Command line: ``python -m mahia <command>``.

    run               execute notebooks headlessly (papermill) and write results, figures, report
    list              list the notebooks
    report            rebuild summary.json and report.md of a device folder from its records
    readme            print (or --write into README.md) the headline table of a committed run
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
    r.add_argument("--notebooks", "-n", default=None,
                   help="comma-separated numbers or names (e.g. 00,03 or 03_triton_fusion); default all")
    r.add_argument("--out", default=None, help="folder for executed notebooks and the report "
                                               "(default runs/<date>-<device>-<profile>/)")
    r.add_argument("--timeout", type=float, default=1800, help="seconds allowed per notebook")
    r.add_argument("--results-dir", default=None, help="results root (default data/results)")
    r.add_argument("--figures-dir", default=None, help="figures root (default figures)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--param", "-p", action="append", default=[], metavar="NAME=VALUE",
                   help="set a notebook parameter, e.g. -p batch=8 -p \"modes=['default']\" (repeatable)")
    sub.add_parser("list", help="list the notebooks")
    rep = sub.add_parser("report", help="rebuild summary.json and report.md from the records")
    rep.add_argument("folder", nargs="?", default=None, help="device folder (default: every folder)")
    rd = sub.add_parser("readme", help="headline table of a committed run")
    rd.add_argument("folder", help="device folder, e.g. data/results/nvidia-h100-80gb-hbm3")
    rd.add_argument("--write", action="store_true", help="replace the table between the markers in README.md")
    c = sub.add_parser("clean-notebooks", help="strip outputs from the notebooks")
    c.add_argument("--check", action="store_true", help="only check; exit 1 if any notebook has outputs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from mahia import runner

    try:
        if args.cmd == "run":
            return runner.run(profile=args.profile, device=args.device, notebooks=args.notebooks,
                              out=args.out, timeout=args.timeout, results_dir=args.results_dir,
                              figures_dir=args.figures_dir, seed=args.seed,
                              progress=not args.no_progress, params=args.param)
        if args.cmd == "list":
            for nb in runner.list_notebooks():
                print(nb.stem)
            return 0
        if args.cmd == "report":
            from mahia.measure.report import build_report
            from mahia.measure.results import atomic_write_text, default_results_dir, write_summary
            folders = [Path(args.folder)] if args.folder else sorted(
                p for p in default_results_dir().iterdir() if p.is_dir())
            for f in folders:
                if not f.is_dir():
                    raise runner.UsageError(f"no such results folder: {f}")
                write_summary(f)
                atomic_write_text(f / "report.md", build_report(f))
                print(f"{f}/summary.json, {f}/report.md")
            return 0
        if args.cmd == "readme":
            return _readme(Path(args.folder), args.write)
        if args.cmd == "clean-notebooks":
            dirty = [nb for nb in runner.list_notebooks() if not runner.notebook_is_clean(nb)]
            if args.check:
                for nb in dirty:
                    print(f"{nb}: committed with outputs; run `python -m mahia clean-notebooks`",
                          file=sys.stderr)
                return 1 if dirty else 0
            for nb in dirty:
                runner.clean_notebook(nb)
                print(f"cleaned {nb}")
            return 0
    except runner.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 2


BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"


def _readme(folder: Path, write: bool) -> int:
    from mahia.measure.report import readme_table
    from mahia.measure.results import REPO_ROOT, write_summary
    from mahia.runner import UsageError

    if not folder.is_dir():
        raise UsageError(f"no such results folder: {folder}")
    write_summary(folder)
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
