"""``python -m mahia.bench {kernels,moe,meta,hybrid,all} [--quick] [--device D] [--results-dir R] [SUITE OPTIONS]``

A suite may take options of its own (``python -m mahia.bench kernels --part list``); they go to its
``parse_args``. On a CPU the sizes are the quick ones (``--quick`` is implied: the full sizes are GPU
sizes). It prints the limits it measured, each suite's rows and, at the end, what ran, what measured
nothing (skipped by the suite, or already recorded) and what failed.

Records go to ``runs/results/<device>/bench_<suite>.csv`` (git-ignored) unless ``--results-dir`` says
otherwise; the committed reference ``data/results/<gpu>/`` is written only through
``python -m mahia reference --bench ...``. Records carry the profile (``quick`` with ``--quick`` or on a
CPU, else ``full``) and the commit (``MAHIA_COMMIT`` or git's). A suite that recorded rows refreshes the
folder's summary of that profile (it is derived from all records, its own included). The measured
ceilings are written to the folder (``ceilings*.json``) only as a part of a runner run (``MAHIA_RUN_ID``,
which the notebooks of the run share); on its own the command keeps them to itself, so it never replaces
the ceilings a notebook run measured.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

from mahia.bench import SUITES

EPILOG = """the kernels suite takes options of its own, after its name:
  --part P   parts to run, repeatable or comma-separated: a part, a kernel, a dtype, all, or list
             (print the plan, measure nothing) (default: all parts)
  --fresh    measure again what this commit already recorded (default: skip it)

examples:
  python -m mahia.bench kernels --part list
  python -m mahia.bench kernels --device cuda --part rmsnorm-bf16,host
  python -m mahia.bench moe meta --quick --device cpu"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mahia.bench",
        description="Benchmark suites outside the notebooks; records go to <results-dir>/<device>/bench_<suite>.csv. "
        "At the end it says what ran, what measured nothing (skipped, or already recorded) and what failed.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("suites", nargs="+", help=f"one or more of {', '.join(sorted(SUITES))}, or all (required)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, a smoke run; implied on a CPU (default: off, the full sizes on a GPU)",
    )
    p.add_argument(
        "--device", default="auto", help="auto (CUDA if present), cpu, cuda or cuda:N (default: %(default)s)"
    )
    p.add_argument(
        "--results-dir",
        default=None,
        help="results root (default: runs/results, git-ignored, or MAHIA_RESULTS_DIR)",
    )
    return p


def _listing(suite_kw: dict) -> bool:
    """True for ``--part list``: the suite prints its plan and measures nothing (no ceilings needed)."""
    parts = suite_kw.get("parts") or []
    return any(t.strip() == "list" for s in parts for t in str(s).split(","))


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    args, extra = _parser().parse_known_args(argv)
    names = sorted(SUITES) if "all" in args.suites else list(dict.fromkeys(args.suites))
    bad = [n for n in names if n not in SUITES]
    if bad:
        return _fail(f"unknown suite(s) {', '.join(bad)}; choose from {', '.join(sorted(SUITES))} or all")
    modules = {n: importlib.import_module(SUITES[n]) for n in names}
    suite_kw = {}
    if extra:
        takers = [n for n, m in modules.items() if hasattr(m, "parse_args")]
        if len(takers) != 1 or len(names) != 1:
            return _fail(
                f"unrecognized arguments {' '.join(extra)} (only a single suite that has options of its own, "
                "e.g. kernels, takes more arguments)"
            )
        try:
            suite_kw = modules[takers[0]].parse_args(extra)
        except SystemExit as e:  # argparse already printed the reason
            return 2 if e.code else 0
    from mahia.measure import files, hardware

    try:
        dev = hardware.resolve_device(args.device)
    except (RuntimeError, ValueError) as e:
        return _fail(str(e))
    root = args.results_dir or files.default_results_dir()
    try:
        files.check_writable(root)
    except RuntimeError as e:
        return _fail(str(e))
    quick = args.quick
    if dev.type != "cuda" and not quick:
        print(
            f"{hardware.device_slug(dev)}: no GPU, so the quick sizes (--quick is implied: the full ones are GPU sizes)"
        )
        quick = True
    if _listing(suite_kw):
        return _list(modules, dev, root, quick, suite_kw)
    return _run(modules, dev, root, quick, suite_kw)


def _list(modules: dict, dev, root, quick: bool, suite_kw: dict) -> int:
    from mahia.measure.results import Recorder

    for name, module in modules.items():
        module.run(Recorder(f"bench_{name}", dev, results_dir=root), None, quick=quick, **suite_kw)
    return 0


def _run(modules: dict, dev, root, quick: bool, suite_kw: dict) -> int:
    from mahia.measure import hardware
    from mahia.measure.results import Recorder

    slug = hardware.device_slug(dev)
    profile = "quick" if quick else "full"
    # Part of a runner run: the run's notebooks and suites share one measurement, in the results folder.
    # On its own: measured for this command only, so the ceilings of a notebook run are never replaced.
    shared = root if os.environ.get("MAHIA_RUN_ID") else None
    ceil = hardware.ceilings(dev, results_dir=shared, quick=quick, profile=profile)
    print(
        f"{slug}: limits measured by this command (frac_of_limit divides by them): copy {ceil.copy_gbps:,.0f} GB/s, "
        f"bf16 matmul {ceil.matmul_bf16_tflops:,.4g} TFLOP/s, fp32 matmul {ceil.matmul_fp32_tflops:,.4g} TFLOP/s",
        flush=True,
    )
    ran, empty, failed, folder = [], [], [], None
    for name, module in modules.items():
        t0 = time.perf_counter()
        rec = Recorder(f"bench_{name}", dev, results_dir=root, ceilings=ceil, profile=profile)
        folder = rec.folder
        try:
            module.run(rec, ceil, quick=quick, **suite_kw)
        except Exception as e:  # report and go on with the next suite
            import traceback

            traceback.print_exc()
            print(f"suite {name} FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(name)
        df = rec.frame()
        print(f"\n== {name} ({time.perf_counter() - t0:.0f} s): {len(df)} records ==")
        if len(df):
            cols = ["experiment", "variant", "shape", "dtype", "median_ms", "gbps", "tflops", "frac_of_limit"]
            print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
            rec.summarize()  # the folder's summary stays in step with its records; `python -m mahia report` prints it
            if name not in failed:
                ran.append(f"{name} ({len(df)} records)")
        elif name not in failed:
            empty.append(name)
    print(
        "\nran: "
        + (", ".join(ran) or "nothing")
        + (
            f"; measured nothing: {', '.join(empty)} (skipped or already recorded: see its lines above)"
            if empty
            else ""
        )
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    if ran or failed:
        print(f"records: {folder}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
