"""``python -m mahia.bench {kernels,moe,meta,hybrid,all} [--quick] [--device D] [--results-dir R] [--part P]``

On a CPU the sizes are the quick ones. Records go to ``runs/results/<device>/bench_<suite>.csv`` unless
``--results-dir`` says otherwise (the committed ``data/results/`` only through ``python -m mahia reference``), with
the profile and the commit; a suite that recorded rows refreshes the folder's summary. The measured ceilings are
written to the folder only within a runner run (``MAHIA_RUN_ID``), never replacing those a notebook run measured.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback

from mahia.bench import SUITES

EPILOG = """examples:
  python -m mahia.bench kernels --part list
  python -m mahia.bench kernels --device cuda --part rmsnorm,host
  python -m mahia.bench moe meta --quick --device cpu"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mahia.bench",
        description="Benchmark suites outside the notebooks; records go to <results-dir>/<device>/bench_<suite>.csv.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("suites", nargs="+", help=f"one or more of {', '.join(sorted(SUITES))}, or all (required)")
    p.add_argument("--quick", action="store_true", help="small sizes, a smoke run; implied on a CPU (default: off)")
    p.add_argument(
        "--device", default="auto", help="auto (CUDA if present), cpu, cuda or cuda:N (default: %(default)s)"
    )
    p.add_argument("--results-dir", default=None, help="results root (default: runs/results or MAHIA_RESULTS_DIR)")
    p.add_argument(
        "--part",
        action="append",
        default=None,
        help="the kernels suite's parts, repeatable or comma-separated: host, a kernel, all, or list (print the "
        "plan, measure nothing) (default: all)",
    )
    return p


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    names = sorted(SUITES) if "all" in args.suites else list(dict.fromkeys(args.suites))
    bad = [n for n in names if n not in SUITES]
    if bad:
        return _fail(f"unknown suite(s) {', '.join(bad)}; choose from {', '.join(sorted(SUITES))} or all")
    if args.part and names != ["kernels"]:
        return _fail("--part is an option of the kernels suite alone: python -m mahia.bench kernels --part ...")
    modules = {n: importlib.import_module(SUITES[n]) for n in names}
    kw = {"parts": args.part} if args.part else {}
    from mahia.measure import files, hardware
    from mahia.measure.results import Recorder

    try:
        dev = hardware.resolve_device(args.device)
        root = args.results_dir or files.default_results_dir()
        files.check_writable(root)
        if args.part:
            modules["kernels"]._select(args.part)
    except (RuntimeError, ValueError) as e:
        return _fail(str(e))
    quick = args.quick
    if dev.type != "cuda" and not quick:
        print(
            f"{hardware.device_slug(dev)}: no GPU, so the quick sizes (--quick is implied: the full ones are GPU sizes)"
        )
        quick = True
    profile = "quick" if quick else "full"
    if any(t.strip() == "list" for s in args.part or [] for t in s.split(",")):  # the plan: no ceilings, no records
        modules["kernels"].run(Recorder("bench_kernels", dev, results_dir=root), None, quick=quick, **kw)
        return 0
    # Part of a runner run: the run's notebooks and suites share one measurement, in the results folder.
    ceil = hardware.ceilings(
        dev, results_dir=root if os.environ.get("MAHIA_RUN_ID") else None, quick=quick, profile=profile
    )
    print(
        f"{hardware.device_slug(dev)}: limits measured by this command (frac_of_limit divides by them): copy "
        f"{ceil.copy_gbps:,.0f} GB/s, bf16 matmul {ceil.matmul_bf16_tflops:,.4g} TFLOP/s, fp32 matmul "
        f"{ceil.matmul_fp32_tflops:,.4g} TFLOP/s",
        flush=True,
    )
    ran, empty, failed, folder = [], [], [], None
    for name, module in modules.items():
        t0 = time.perf_counter()
        rec = Recorder(f"bench_{name}", dev, results_dir=root, ceilings=ceil, profile=profile)
        folder = rec.folder
        try:
            module.run(rec, ceil, quick=quick, **kw)
        except Exception as e:  # report and go on with the next suite
            traceback.print_exc()
            print(f"suite {name} FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(name)
        df = rec.frame()
        print(f"\n== {name} ({time.perf_counter() - t0:.0f} s): {len(df)} records ==")
        if len(df):
            cols = ["experiment", "variant", "shape", "dtype", "median_ms", "gbps", "tflops", "frac_of_limit"]
            print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
            rec.summarize()  # the folder's summary stays in step with its records
        if name not in failed and len(df):
            ran.append(f"{name} ({len(df)} records)")
        elif name not in failed:
            empty.append(name)
    print(
        "\nran: "
        + (", ".join(ran) or "nothing")
        + (f"; measured nothing: {', '.join(empty)} (skipped: see its lines above)" if empty else "")
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    if ran or failed:
        print(f"records: {folder}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
