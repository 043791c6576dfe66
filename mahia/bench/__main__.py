"""``python -m mahia.bench {kernels,moe,meta,hybrid,all} [--quick] [--device D] [--results-dir R] [SUITE OPTIONS]``

A suite may take options of its own (``python -m mahia.bench kernels --part list``); they go to its
``parse_args``. The summary of the results folder is rewritten, but only this run's rows are printed.

Records go to ``runs/results/<device>/bench_<suite>.csv`` (git-ignored) unless ``--results-dir`` says
otherwise; the committed reference ``data/results/<gpu>/`` is written only through
``python -m mahia reference --bench ...``. Records carry the profile (``quick`` with ``--quick``, else
``full``) and the commit (``MAHIA_COMMIT`` or git's).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from mahia.bench import SUITES


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mahia.bench",
        epilog="examples:\n  python -m mahia.bench kernels --part list\n"
        "  python -m mahia.bench kernels --device cuda --part rmsnorm-bf16,host\n"
        "  python -m mahia.bench moe meta --quick --device cpu",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("suites", nargs="+", help=f"one or more of {sorted(SUITES)} or 'all'")
    p.add_argument("--quick", action="store_true", help="small sizes, a smoke run (default: off; the CPU needs it)")
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--results-dir", default=None, help="results root (default: runs/results, git-ignored)")
    args, extra = p.parse_known_args(argv)
    names = sorted(SUITES) if "all" in args.suites else args.suites
    bad = [n for n in names if n not in SUITES]
    if bad:
        print(f"error: unknown suite(s) {bad}; choose from {sorted(SUITES)} or 'all'", file=sys.stderr)
        return 2
    modules = {n: importlib.import_module(SUITES[n]) for n in names}
    suite_kw = {}
    if extra:
        takers = [n for n, m in modules.items() if hasattr(m, "parse_args")]
        if len(takers) != 1 or len(names) != 1:
            print(
                f"error: unrecognized arguments {extra} (only a single suite that has options of its own, "
                f"e.g. kernels, takes more arguments)",
                file=sys.stderr,
            )
            return 2
        try:
            suite_kw = modules[takers[0]].parse_args(extra)
        except SystemExit as e:  # argparse already printed the reason
            return 2 if e.code else 0
    from mahia.measure import files, hardware
    from mahia.measure.results import Recorder

    try:
        dev = hardware.resolve_device(args.device)
    except (RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    root = args.results_dir or files.default_results_dir()
    try:
        files.check_writable(root)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    profile = "quick" if args.quick else "full"
    ceil = hardware.ceilings(dev, results_dir=root, quick=args.quick, profile=profile)
    print(
        f"{hardware.device_slug(dev)}: copy {ceil.copy_gbps:,.0f} GB/s, bf16 matmul "
        f"{ceil.matmul_bf16_tflops:,.4g} TFLOP/s, fp32 matmul {ceil.matmul_fp32_tflops:,.4g} TFLOP/s",
        flush=True,
    )
    rc = 0
    rec = None
    for name in names:
        t0 = time.perf_counter()
        rec = Recorder(f"bench_{name}", dev, results_dir=root, ceilings=ceil, profile=profile)
        try:
            modules[name].run(rec, ceil, quick=args.quick, **suite_kw)
        except Exception as e:  # report and go on with the next suite
            import traceback

            traceback.print_exc()
            print(f"suite {name} FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            rc = 1
        df = rec.frame()
        print(f"\n== {name} ({time.perf_counter() - t0:.0f} s) ==")
        if len(df):
            cols = ["experiment", "variant", "shape", "dtype", "median_ms", "gbps", "tflops", "frac_of_limit"]
            print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    if rec is not None:
        rec.summarize()  # keeps the folder's summary in step with its records; printed by 'python -m mahia report'
        print(f"\nrecords: {rec.folder}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
