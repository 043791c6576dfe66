"""Command line: ``python -m mahia <command>`` (run, reference, list, report, readme, site, commit,
clean-notebooks; ``--help`` lists them). Bad input gets one clear line on stderr and exit code 2."""

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
  python -m mahia site                               # the committed run's notebooks as HTML, in runs/site/

Ctrl-C (or SIGTERM) stops the running notebook and its kernel, writes the report of what ran and exits
130 (143). Bad input gets one clear line on stderr and exit code 2, before anything runs."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mahia",
        description="mahia's notebooks, runs, reference and reports",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help)

    r = command("run", "execute notebooks headlessly (papermill) and write results, figures and a report to runs/")
    r.add_argument(
        "--profile", default="auto", help="quick | full | auto: full on a GPU, quick on a CPU (default: %(default)s)"
    )
    r.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] (default: %(default)s, a GPU if any)")
    r.add_argument("--results-dir", default=None, help="results root (default: runs/results, or MAHIA_RESULTS_DIR)")
    r.add_argument("--figures-dir", default=None, help="figures root (default: runs/figures, or MAHIA_FIGURES_DIR)")
    f = command(
        "reference",
        "write the committed reference data/results/<gpu>/ and figures/<gpu>/ (GPU, clean tree, full profile)",
    )
    f.add_argument("--device", default="cuda", help="cuda[:N]; a CPU run is never the reference (default: %(default)s)")
    f.add_argument(
        "--bench",
        default=None,
        help="benchmark suites: all, none or e.g. kernels,moe (default: all when --notebooks is not given either, else none)",
    )
    f.add_argument(
        "--force", action="store_true", help="run parts already recorded for this commit again (default: skip them)"
    )
    f.add_argument(
        "--allow-dirty",
        action="store_true",
        help="run although mahia/ or notebooks/ have uncommitted changes, the records say -dirty (default: refuse)",
    )
    for c, every in ((r, "all"), (f, "all when --bench is not given either, else none")):
        c.add_argument(
            "--notebooks",
            "-n",
            action="append",
            default=None,
            metavar="NB",
            help="numbers or names, comma-separated (00,03 or 03_triton_fusion) or repeated (-n 00 -n 03), or all; an empty or unknown name is refused (default: "
            + every
            + ")",
        )
        c.add_argument(
            "--out",
            default=None,
            help="folder for the executed notebooks, logs and report; where it holds an earlier run, <out>-2 (default: a new runs/<date>-<time>-<device>-<profile>/)",
        )
        c.add_argument(
            "--timeout", type=float, default=1800, help="seconds allowed per notebook or suite (default: %(default)s)"
        )
        c.add_argument(
            "--seed", type=int, default=0, help="random seed every notebook starts from (default: %(default)s)"
        )
        c.add_argument("--no-progress", action="store_true", help="no progress bar (default: a bar on stderr)")
        c.add_argument(
            "--param",
            "-p",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="set a parameter of the notebooks' cell tagged 'parameters', e.g. -p batch=8 -p \"modes=['default']\"; VALUE is read as JSON or a Python literal, else a string, and must match the type the notebook declares (default: none, the notebooks' own values)",
        )
    command("list", "list the notebooks")
    rep = command("report", "rebuild the summaries and report.md of a device folder from its records")
    rep.add_argument(
        "folder",
        nargs="?",
        default=None,
        help="device folder, e.g. runs/results/<device> (default: every folder of data/results)",
    )
    rd = command(
        "readme",
        "print (or --write into README.md) the headline table of the reference GPU folders and the wall time of each part",
    )
    rd.add_argument(
        "folder",
        nargs="*",
        default=[],
        help="device folder(s), e.g. data/results/nvidia-h200 (default: every folder of data/results with a full-profile summary.json)",
    )
    rd.add_argument(
        "--write",
        action="store_true",
        help="replace the blocks between their markers in README.md (default: print them)",
    )
    st = command("site", "build a static HTML site of a run: headline table, figures, one page per executed notebook")
    st.add_argument(
        "--results",
        default=None,
        help="results folder with executed notebooks (notebooks/*.ipynb, or *.ipynb as in a runs/<run>/ folder) and summary.json (default: the newest folder of data/results/ that has notebooks/)",
    )
    st.add_argument(
        "--figures",
        default=None,
        help="folder of PNG figures to show (default: figures/<results folder name>/ when it exists)",
    )
    st.add_argument("--out", default=None, help="folder for the site, replaced on each build (default: runs/site/)")
    command("commit", "print the commit records get here (MAHIA_COMMIT or git's, -dirty if so)")
    c = command("clean-notebooks", "strip outputs and per-machine metadata from notebooks/*.ipynb (nbstripout)")
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

    kw = {k: v for k, v in vars(args).items() if k not in ("cmd", "no_progress", "param")}
    try:
        if args.cmd in ("run", "reference"):
            return getattr(runner, args.cmd)(**kw, progress=not args.no_progress, params=args.param)
        if args.cmd == "site":
            from mahia.site import build_site

            index = build_site(args.results, args.out, args.figures)
            print(f"site: {index} (open it in a browser, or serve {index.parent} from any static host)")
        elif args.cmd == "commit":
            from mahia.measure.files import run_commit

            print(run_commit())
        elif args.cmd == "list":
            print("\n".join(nb.stem for nb in runner.list_notebooks()))
        elif args.cmd == "report":
            return _report(Path(args.folder) if args.folder else None)
        elif args.cmd == "readme":
            return _readme([Path(f) for f in args.folder], args.write)
        elif args.cmd == "clean-notebooks":
            dirty = [nb for nb in runner.list_notebooks() if not runner.notebook_is_clean(nb)]
            for nb in dirty:
                if args.check:
                    print(
                        f"{nb}: committed with outputs or per-machine metadata; run `python -m mahia clean-notebooks`",
                        file=sys.stderr,
                    )
                else:
                    runner.clean_notebook(nb)
                    print(f"cleaned {nb}")
            return 1 if dirty and args.check else 0
    except runner.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _report(folder: Path | None) -> int:
    """Every profile's summary and report.md of one device folder (default: each reference folder)."""
    from mahia.measure import files
    from mahia.measure.report import build_report
    from mahia.measure.summary import write_summaries
    from mahia.runner import UsageError

    root = files.reference_results_dir()
    folders = [folder] if folder is not None else sorted(p for p in root.glob("*") if p.is_dir())
    if not folders:
        raise UsageError(f"no results folder in {root}; name one, e.g. runs/results/<device>")
    for f in folders:
        if not f.is_dir():
            raise UsageError(f"no such results folder: {f}")
        written = write_summaries(f)
        files.atomic_write_text(f / "report.md", build_report(f))
        print(f"{f}: {', '.join(files.profile_file(f, 'summary', p).name for p in written)}, report.md")
    return 0


BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"


def _readme(folders: list[Path], write: bool) -> int:
    """The README's generated blocks, from committed data only: the headline table of the reference folders (those
    named, or every folder of data/results with a full-profile summary.json, by GPU slug; each summary must say what
    its records say) and the wall time of each of their parts. Everything is checked before anything is written."""
    from mahia.measure import report
    from mahia.measure.files import REPO_ROOT
    from mahia.measure.summary import headline, read_summary
    from mahia.runner import UsageError

    root = REPO_ROOT / "data" / "results"
    folders = folders or [f for f in root.glob("*") if (f / "summary.json").is_file()]
    if not folders:
        raise UsageError(f"no folder of {root} has a full-profile summary.json: name one")
    for f in folders:
        try:
            summary = read_summary(f, "full")
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(str(e).splitlines()[0]) from None
        if summary.get("metrics") != headline(f, "full")["metrics"]:
            raise UsageError(f"{f}/summary.json does not match its records: `python -m mahia report {f}` rewrites it")
    folders = sorted(set(folders), key=lambda f: f.name)
    blocks = {(BEGIN, END): report.readme_tables(folders)}
    blocks[report.RUNS_BEGIN, report.RUNS_END] = report.render_runs_block(folders)
    if not write:
        print("\n\n".join(f"{begin}\n{block}{end}" for (begin, end), block in blocks.items()))
        return 0
    text = (REPO_ROOT / "README.md").read_text()
    for (begin, end), block in blocks.items():
        if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
            raise UsageError(f"README.md needs one {begin} ... {end} pair, in that order")
        head, rest = text.split(begin, 1)
        text = f"{head}{begin}\n{block}{end}{rest.split(end, 1)[1]}"
    (REPO_ROOT / "README.md").write_text(text)
    print(f"README.md: headline table and part timings from {', '.join(f.name for f in folders)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
