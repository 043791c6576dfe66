"""Command line: ``python -m mahia <command>``.

    run               execute notebooks headlessly (papermill) and write results, figures, report
                      (to runs/, git-ignored)
    reference         write the committed reference data/results/<gpu>/ and figures/<gpu>/: a GPU, a
                      clean tree, the full profile, in parts that resume
    list              list the notebooks
    report            rebuild the summaries and report.md of a device folder from its records
    readme            print (or --write into README.md) the headline table of every reference GPU folder and
                      the wall time of each of its parts (parts/*.json)
    site              build a static HTML site (index, headline table, figures, one page per executed
                      notebook) from a results folder, to read a run without a GPU
    commit            print the commit records get here (``MAHIA_COMMIT`` or git's, -dirty if so)
    clean-notebooks   strip outputs from notebooks/*.ipynb (--check: fail if git sees any)

Bad input gets one clear line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXAMPLES = """examples:
  python -m mahia run                                # every notebook: full profile on a GPU, else quick on the CPU
  python -m mahia run -n 00 -n 03 --device cpu       # two notebooks on the CPU (or -n 00,03)
  python -m mahia run -n 08 -p n_experts=16          # set a parameter of notebook 08's parameters cell
  python -m mahia run --out runs/mine                # the executed notebooks and report in a folder you name
  python -m mahia reference --bench kernels -n none  # on a GPU, from a clean tree: one part of the reference
  python -m mahia list                               # the notebooks
  python -m mahia site                               # the committed run's notebooks as HTML, in runs/site/
  python -m mahia run --help                         # a command's options and their defaults

Ctrl-C (or SIGTERM) stops the running notebook and its kernel, writes the report of what ran and exits
130 (143). Bad input gets one clear line on stderr and exit code 2, before anything runs."""


def _sub(sub, name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
    return sub.add_parser(
        name, help=help, description=description or help, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def _notebooks_option(p: argparse.ArgumentParser, default_help: str) -> None:
    p.add_argument(
        "--notebooks",
        "-n",
        action="append",
        default=None,
        metavar="NB",
        help="notebooks to run: numbers or names, comma-separated (00,03 or 03_triton_fusion) or repeated "
        f"(-n 00 -n 03), or all; an empty or unknown name is refused (default: {default_help})",
    )


def _param_option(p: argparse.ArgumentParser, extra: str) -> None:
    p.add_argument(
        "--param",
        "-p",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a parameter of the notebooks' cell tagged 'parameters', e.g. -p batch=8 -p \"modes=['default']\" "
        "(repeatable; VALUE is read as JSON or a Python literal, else a string, and must match the type the "
        f"notebook declares){extra} (default: none, the notebooks' own values)",
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mahia",
        description=__doc__.split("\n\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    r = _sub(sub, "run", "execute notebooks headlessly (papermill) and write results, figures and a report to runs/")
    r.add_argument(
        "--profile",
        default="auto",
        help="quick | full | auto: full on a GPU, quick on a CPU (default: %(default)s)",
    )
    r.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] (default: %(default)s, a GPU if any)")
    _notebooks_option(r, "all")
    r.add_argument(
        "--out",
        default=None,
        help="folder for the executed notebooks, logs and report; where it holds an earlier run, <out>-2 "
        "(default: a new runs/<date>-<time>-<device>-<profile>/)",
    )
    r.add_argument("--timeout", type=float, default=1800, help="seconds allowed per notebook (default: %(default)s)")
    r.add_argument("--results-dir", default=None, help="results root (default: runs/results, or MAHIA_RESULTS_DIR)")
    r.add_argument("--figures-dir", default=None, help="figures root (default: runs/figures, or MAHIA_FIGURES_DIR)")
    r.add_argument("--seed", type=int, default=0, help="random seed every notebook starts from (default: %(default)s)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar (default: a bar on stderr)")
    _param_option(r, "")
    f = _sub(
        sub,
        "reference",
        "write the committed reference data/results/<gpu>/ and figures/<gpu>/ (GPU, clean tree, full profile)",
    )
    _notebooks_option(f, "all when --bench is not given either, else none")
    f.add_argument(
        "--bench",
        default=None,
        help="benchmark suites to run: all, none or e.g. kernels,moe "
        "(default: all when --notebooks is not given either, else none)",
    )
    f.add_argument("--device", default="cuda", help="cuda[:N]; a CPU run is never the reference (default: %(default)s)")
    f.add_argument(
        "--timeout", type=float, default=1800, help="seconds allowed per notebook or suite (default: %(default)s)"
    )
    f.add_argument(
        "--out",
        default=None,
        help="folder for executed notebooks, logs and the run's report; where it holds an earlier run, <out>-2 "
        "(default: a new runs/<date>-<time>-<device>-reference/)",
    )
    f.add_argument("--seed", type=int, default=0, help="random seed every notebook starts from (default: %(default)s)")
    f.add_argument(
        "--force", action="store_true", help="run parts already recorded for this commit again (default: skip them)"
    )
    f.add_argument(
        "--allow-dirty",
        action="store_true",
        help="run although mahia/ or notebooks/ have uncommitted changes, the records say -dirty (default: refuse)",
    )
    f.add_argument("--no-progress", action="store_true", help="no progress bar (default: a bar on stderr)")
    _param_option(f, "; recorded in parts/<notebook>.json")
    _sub(sub, "list", "list the notebooks")
    rep = _sub(sub, "report", "rebuild the summaries and report.md of a device folder from its records")
    rep.add_argument(
        "folder",
        nargs="?",
        default=None,
        help="device folder, e.g. runs/results/<device> (default: every device folder of the reference, data/results)",
    )
    rep.add_argument(
        "--prune",
        action="store_true",
        help="first drop each record its part file (parts/<part>.json) does not name: older commits' runs of a "
        "notebook or suite, so every summary comes from the commits the parts name; needs a folder written by "
        "`mahia reference` (default: keep every record)",
    )
    rd = _sub(
        sub,
        "readme",
        "print (or --write into README.md) the headline table of every reference GPU and its parts' timings",
        "print (or --write into README.md) the README's generated parts, from committed data only: the headline "
        "table (full profile, a column per GPU folder) and the wall time of each part (each folder's parts/*.json)",
    )
    rd.add_argument(
        "folder",
        nargs="*",
        default=[],
        help="device folder(s) of the headline table and the parts timings, e.g. data/results/nvidia-h200 "
        "(default: every folder of data/results with a full-profile summary.json; columns sorted by folder name)",
    )
    rd.add_argument(
        "--write",
        action="store_true",
        help="replace the parts between their markers in README.md (default: print them)",
    )
    st = _sub(
        sub,
        "site",
        "build a static HTML site of a run: headline table, figures, one page per executed notebook",
    )
    st.add_argument(
        "--results",
        default=None,
        help="results folder with executed notebooks (notebooks/*.ipynb, or *.ipynb as in a runs/<run>/ folder) "
        "and summary.json (default: the folder of data/results/ that has notebooks/)",
    )
    st.add_argument(
        "--figures",
        default=None,
        help="folder of PNG figures to show (default: figures/<results folder name>/ when it exists)",
    )
    st.add_argument("--out", default=None, help="folder for the site, replaced on each build (default: runs/site/)")
    _sub(sub, "commit", "print the commit records get here (MAHIA_COMMIT or git's, -dirty if so)")
    c = _sub(sub, "clean-notebooks", "strip outputs and per-machine metadata from notebooks/*.ipynb (nbstripout)")
    c.add_argument(
        "--check",
        action="store_true",
        help="only check what git sees (the index); exit 1 if a notebook has outputs (default: strip the files)",
    )

    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _command(args)
    except KeyboardInterrupt:  # before a run's own handler is in place (a run handles Ctrl-C itself)
        print("interrupted", file=sys.stderr)
        return 130


def _command(args: argparse.Namespace) -> int:
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
        if args.cmd == "site":
            from mahia.site import build_site

            index = build_site(args.results, args.out, args.figures)
            print(f"site: {index} (open it in a browser, or serve {index.parent} from any static host)")
            return 0
        if args.cmd == "commit":
            from mahia.measure.files import run_commit

            print(run_commit())
            return 0
        if args.cmd == "list":
            for nb in runner.list_notebooks():
                print(nb.stem)
            return 0
        if args.cmd == "report":
            return _report(Path(args.folder) if args.folder else None, prune=args.prune)
        if args.cmd == "readme":
            return _readme([Path(f) for f in args.folder], args.write)
        if args.cmd == "clean-notebooks":
            dirty = [nb for nb in runner.list_notebooks() if not runner.notebook_is_clean(nb)]
            if args.check:
                for nb in dirty:
                    print(
                        f"{nb}: committed with outputs or per-machine metadata; run `python -m mahia clean-notebooks`",
                        file=sys.stderr,
                    )
                return 1 if dirty else 0
            for nb in dirty:
                runner.clean_notebook(nb)
                print(f"cleaned {nb}")
            return 0
    except runner.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 2


def _report(folder: Path | None, prune: bool = False) -> int:
    """Every profile's summary and report.md of one device folder (default: each reference folder); says
    which commit(s) the full profile's metrics come from and which were not made by HEAD. ``prune``: first
    keep only the records its parts name (:func:`mahia.measure.results.keep_part_commits`)."""
    from mahia.measure import files
    from mahia.measure.report import build_report, commit_marks
    from mahia.measure.results import headline, keep_part_commits, write_summaries
    from mahia.runner import UsageError

    if prune:
        if folder is None:
            raise UsageError("--prune drops records: name the folder, e.g. data/results/<gpu>")
        try:
            dropped = keep_part_commits(folder)
        except (ValueError, FileNotFoundError) as e:
            raise UsageError(str(e)) from None
        for name, n in dropped.items():
            print(f"{folder / name}: {n} record(s) of other commits dropped" if n else f"{folder / name}: kept all")
        if dropped.get("bench_kernels.csv"):
            # The kernel keys are derived in mahia.bench.kernels when its sweep ends, so a prune that drops kernel
            # records derives them again; otherwise they would still name (and read) the dropped commits.
            from mahia.bench.kernels import SUMMARY_STEM
            from mahia.bench.kernels import write_summary as write_kernel_summary

            for stale in folder.glob(f"{SUMMARY_STEM}-*.json"):
                stale.unlink()  # the prune kept full-profile records only
            print(f"{write_kernel_summary(folder, 'full')}: written again from the records kept")

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
            not_head = [k for k in doc["sources"] if any(not files.same_commit(c, head) for c in doc["sources"][k])]
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


def _readme(folders: list[Path], write: bool) -> int:
    """The README's generated parts, from committed data only: the headline table of the reference folders
    (``folders``, default every folder of data/results with a full-profile summary.json) and the wall time of
    each part of them (their ``parts/*.json``). Everything is checked before anything is written."""
    from mahia.measure import report
    from mahia.measure.files import REPO_ROOT
    from mahia.runner import UsageError

    readme = REPO_ROOT / "README.md"
    folders = _reference_folders(folders, REPO_ROOT / "data" / "results")
    try:
        table = report.readme_tables(folders)
        runs_block = report.render_runs_block(folders)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    if not write:
        print(f"{BEGIN}\n{table}{END}\n\n{report.RUNS_BEGIN}\n{runs_block}{report.RUNS_END}")
        return 0
    text = _replace_block(readme.read_text(), BEGIN, END, table)
    text = _replace_block(text, report.RUNS_BEGIN, report.RUNS_END, runs_block)
    readme.write_text(text)
    print(f"README.md: headline table and part timings from {', '.join(_shown(f, REPO_ROOT) for f in folders)}")
    return 0


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def _replace_block(text: str, begin: str, end: str, block: str) -> str:
    from mahia.runner import UsageError

    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise UsageError(f"README.md needs one {begin} ... {end} pair, in that order")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}{end}{tail}"


def _reference_folders(folders: list[Path], root: Path) -> list[Path]:
    """The folders of the README's headline table, each checked (a full-profile summary.json that matches its
    records), sorted by GPU slug: those named, or every folder of ``root`` that has
    such a summary."""
    from mahia.measure.results import headline, read_summary
    from mahia.runner import UsageError

    if not folders:
        found = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        folders = [f for f in found if _summary_or_empty(f)]
        if not folders:
            raise UsageError(
                f"no folder of {root} has a full-profile summary.json: name one "
                "(`python -m mahia report <folder>` writes it from the records)"
            )
    folders = sorted(dict.fromkeys(folders), key=lambda f: f.name)
    for f in folders:
        if not f.is_dir():
            raise UsageError(f"no such results folder: {f}")
        try:
            summary = read_summary(f, "full")
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
        except ValueError:
            raise UsageError(f"{f}/summary.json is not JSON: `python -m mahia report {f}` rewrites it") from None
        fresh = headline(f, "full")
        if any(summary.get(k) != v for k, v in fresh.items()):
            raise UsageError(
                f"{f}/summary.json does not match its records (they changed after it was written): "
                f"`python -m mahia report {f}` rewrites it"
            )
    return folders


def _summary_or_empty(folder: Path) -> dict:
    from mahia.measure.results import read_summary

    try:
        doc = read_summary(folder, "full")
    except (FileNotFoundError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


if __name__ == "__main__":
    sys.exit(main())
