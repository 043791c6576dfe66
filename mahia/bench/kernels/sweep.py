"""Measuring the kernel sweep: checks, timings, records and the resumable run."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from mahia import ops
from mahia.bench.kernels.shapes import (
    _MAHIA,
    _REFERENCE,
    COPY_MIN_BYTES,
    DEVICE_BUDGET,
    EAGER_BUDGET,
    EST_MIN_H100,
    GRAD_INPUTS,
    HOST_SHAPE,
    KERNELS,
    OP,
    PASSES,
    QUICK_BUDGET,
    ROLE,
    Part,
    Variant,
    _grid,
    _liger_ops,
    _shape_str,
    _variants,
    eager_bench_interleaved,
    input_bytes,
    make_inputs,
    min_bytes,
    select_parts,
)
from mahia.bench.kernels.summary import plot_recorded, write_summary
from mahia.measure.checks import CorrectnessError, compare_fn, tolerance
from mahia.measure.timing import bench

# ------------------------------------------------------------------------------------------- checking


# ------------------------------------------------------------------------------------------- measuring


def _dtype_str(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _key(experiment, variant, shape, dtype) -> tuple[str, str, str, str]:
    return experiment, variant, _shape_str(shape), _dtype_str(dtype)


def _done(recorder) -> set[tuple[str, str, str, str]]:
    """(experiment, variant, shape, dtype) already in the recorder's CSV for its commit and profile."""
    import pandas as pd

    path = Path(recorder.path)
    if not path.exists():
        return set()
    df = pd.read_csv(path, dtype={"shape": str, "dtype": str, "commit": str, "profile": str})
    if df.empty:
        return set()
    commit, profile = getattr(recorder, "commit", None), getattr(recorder, "profile", None)
    if commit is None or "commit" not in df.columns:
        return set()
    sel = df[df["commit"].astype(str) == str(commit)]
    if profile is not None and "profile" in df.columns:
        sel = sel[sel["profile"].astype(str) == str(profile)]
    if "device_slug" in df.columns and getattr(recorder, "slug", None):
        sel = sel[sel["device_slug"].astype(str) == str(recorder.slug)]
    return {(str(r.experiment), str(r.variant), str(r.shape), str(r.dtype)) for r in sel.itertuples()}


_DEVICE_NOTE = {
    "cuda": "timing=device (CUDA graph replay, L2 flushed)",
    "cpu": "timing=device (CPU: bench(), host time is device time)",
}
_EAGER_NOTE = "timing=eager ({n} calls back to back, one synchronize; per-call time)"


def _measure(
    recorder,
    experiment: str,
    variants: list[Variant],
    make_inputs: Callable,
    reference: Callable,
    *,
    backward: bool,
    grad_inputs: list[int],
    nbytes: float,
    shape,
    dtype,
    modes: dict[str, str] | None = None,
    requires_grad: bool | None = None,
    done: set | None = None,
    copy: bool | None = None,
    budget: dict | None = None,
    failures: list | None = None,
    phases: dict | None = None,
) -> None:
    """Check (:func:`mahia.measure.checks.compare_fn`, errors on the device), then time each variant: forward only,
    or forward + backward with fixed output grads.

    ``modes`` maps a timing mode to the experiment it is recorded under: 'device' (``bench``, on CUDA a
    CUDA-graph replay, one variant after the other) and/or 'eager' (:func:`eager_bench_interleaved`: every
    variant's samples interleaved, so that their ratios come from one window of the host's time); default
    ``{"device": experiment}``. ``requires_grad`` (default ``backward``) makes the ``grad_inputs`` leaves
    require grad, also for a forward. Records whose key is in ``done`` are not measured again (nor checked,
    when none is left). ``copy`` (default: on CUDA) times a copy of the same bytes after the device-time rows.
    A variant that fails its check raises ``CorrectnessError``; with a ``failures`` list it is appended
    there instead (and not timed), and the other variants go on. ``phases``, when given, adds the seconds
    spent checking, timing device time, timing eager time and timing the copy (keys ``check``, ``device``,
    ``eager``, ``copy``): where a part's time goes.
    """
    modes = modes or {"device": experiment}
    done = done if done is not None else set()
    phases = phases if phases is not None else {}
    dev = torch.device(recorder.device)
    cuda = dev.type == "cuda"
    budget = budget or {}
    requires_grad = backward if requires_grad is None else requires_grad
    tol = tolerance(dtype)
    eager_steps: dict[str, Callable] = {}  # variant -> its step, timed together after the loop
    checked: dict[str, tuple] = {}  # variant -> (Variant, Comparison, check seconds)

    def record(v, exp, timing, note, cmp, check_s):
        if v.name == "torch.compile":
            note += f"; check incl. compile {check_s:.1f} s"
        recorder.timing(
            exp,
            v.name,
            ROLE[v.name],
            timing,
            shape=shape,
            dtype=dtype,
            bytes=nbytes,
            limit="copy",
            rel_err=cmp.max_error,
            notes="; ".join(filter(None, [note, v.notes])),
        )
        done.add(_key(exp, v.name, shape, dtype))
        print(
            f"  {exp:24s} {_shape_str(shape):18s} {_dtype_str(dtype):8s} {v.name:13s} "
            f"{timing.median_ms:9.4f} ms {nbytes / timing.median_ms / 1e6:8.1f} GB/s  "
            f"err {cmp.max_error:.1e}  (check {check_s:.1f} s)",
            flush=True,
        )

    for v in variants:
        todo = {m: e for m, e in modes.items() if _key(e, v.name, shape, dtype) not in done}
        if not todo:
            continue
        # Correct first, on fresh inputs (compare_fn upcasts them to float64 for the reference).
        t0 = time.perf_counter()
        try:
            cmp = compare_fn(
                lambda *a, v=v: v.fn(*v.adapt(a)),
                reference,
                make_inputs(),
                grads=backward,
                grad_inputs=grad_inputs,
                tol=tol,
                name=f"{experiment} {v.name} {_shape_str(shape)} {_dtype_str(dtype)}",
            )
        except CorrectnessError as e:
            if failures is None:
                raise
            failures.append(str(e))
            print(
                f"  {experiment:24s} {_shape_str(shape):18s} {_dtype_str(dtype):8s} {v.name:13s} "
                f"FAILED its check, not timed: {e}",
                flush=True,
            )
            continue
        check_s = time.perf_counter() - t0
        phases["check"] = phases.get("check", 0.0) + check_s
        inputs = v.adapt(make_inputs())
        leaves = [inputs[i] for i in grad_inputs] if requires_grad else []
        for t in leaves:
            t.requires_grad_(True)
        if backward:
            with torch.no_grad():
                outs = v.fn(*inputs)
            outs = outs if isinstance(outs, tuple) else (outs,)
            grads = [torch.randn_like(o) for o in outs]
            del outs

            def step(v=v, inputs=inputs, leaves=leaves, grads=grads):
                for t in leaves:
                    t.grad = None
                outs = v.fn(*inputs)
                torch.autograd.backward(outs if isinstance(outs, tuple) else (outs,), grads)
        else:

            def step(v=v, inputs=inputs):
                v.fn(*inputs)

        unknown = set(todo) - {"device", "eager"}
        if unknown:
            raise ValueError(f"unknown timing mode {sorted(unknown)[0]!r}; known: device, eager")
        if "device" in todo:
            t0 = time.perf_counter()
            kw = {k: budget[k] for k in ("warmup_ms", "rep_ms", "max_reps") if k in budget}
            note = _DEVICE_NOTE.get(dev.type, f"timing=device ({dev.type})")
            if cuda:
                try:
                    timing = bench(step, device=dev, cuda_graph=True, **kw)
                except RuntimeError as e:  # not capturable: time it launched, and say so
                    timing = bench(step, device=dev, **kw)
                    note = f"timing=device (launched: not capturable in a CUDA graph: {str(e)[:120]})"
            else:
                timing = bench(step, device=dev, **kw)
            record(v, todo["device"], timing, note, cmp, check_s)
            phases["device"] = phases.get("device", 0.0) + time.perf_counter() - t0
        if "eager" in todo:
            eager_steps[v.name] = step
            checked[v.name] = (v, cmp, check_s)
        del inputs, leaves, step
    if eager_steps:
        t0 = time.perf_counter()
        kw = {k: budget[k] for k in ("warmup_ms", "rep_ms", "sample_ms", "min_calls", "min_samples") if k in budget}
        info: dict = {}
        timings = eager_bench_interleaved(eager_steps, device=dev, info=info, **kw)
        others = len(eager_steps) - 1
        for name, timing in timings.items():
            v, cmp, check_s = checked[name]
            note = _EAGER_NOTE.format(n=info[name]["calls"])
            if others:
                note += f"; samples interleaved with {others} other variant(s)"
            record(v, modes["eager"], timing, note, cmp, check_s)
        phases["eager"] = phases.get("eager", 0.0) + time.perf_counter() - t0
        del eager_steps
    if (cuda if copy is None else copy) and "device" in modes:
        exp = modes["device"]
        if _key(exp, "copy_same_bytes", shape, dtype) not in done:
            t0 = time.perf_counter()
            kw = {k: budget[k] for k in ("warmup_ms", "rep_ms", "max_reps") if k in budget}
            _copy_of_same_bytes(recorder, exp, nbytes, shape, dtype, **kw)
            done.add(_key(exp, "copy_same_bytes", shape, dtype))
            phases["copy"] = phases.get("copy", 0.0) + time.perf_counter() - t0


def _copy_of_same_bytes(recorder, experiment: str, nbytes: int, shape, dtype, **bench_kw) -> None:
    """Time a plain copy that moves ``nbytes`` (half read, half written) and record its GB/s as a
    fraction of the measured copy ceiling: the limit at *this* size. The ceiling is measured on a 2 GiB
    copy; a smaller one loses its ramp-up and its last partial wave, so a kernel that moves a few
    hundred MB cannot reach 1.0 of the ceiling either (notebook 00's copy sweep)."""
    n = max(1, int(nbytes) // 8)  # float32 elements per side: half the bytes read, half written
    src = torch.empty(n, device=recorder.device, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    # Launched, as the ceiling is measured: captured in a CUDA graph, copy_ becomes a memcpy node that
    # the copy engines run, at about 2/3 of the SMs' rate on an H200.
    t = bench(lambda: dst.copy_(src), device=recorder.device, **bench_kw)
    moved = 2 * n * 4  # bytes
    gbps = moved / t.median_ms / 1e6
    frac = gbps / recorder.ceilings.copy_gbps if recorder.ceilings else float("nan")
    recorder.metric(
        experiment,
        "copy_same_bytes",
        frac,
        unit="fraction of the copy ceiling",
        shape=shape,
        dtype=dtype,
        notes=f"torch copy_ of {moved / 1e6:.0f} MB moved, device time "
        f"{t.median_ms:.4f} ms: the copy limit at this size",
    )
    print(
        f"  {experiment:24s} {_shape_str(shape):18s} {_dtype_str(dtype):8s} {'copy, same MB':13s} "
        f"{t.median_ms:9.4f} ms {gbps:8.1f} GB/s  = {frac:.3f} of the copy ceiling",
        flush=True,
    )


def _free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _phase_text(total_s: float, phases: dict) -> str:
    """'9.1 s (checks incl. compiling 3.2, device time 2.1, eager time 1.5, copy 0.3, the rest 2.0)': where a
    shape's seconds went, so a part's plan can be cut where the time is."""
    names = {"check": "checks incl. compiling", "device": "device time", "eager": "eager time", "copy": "copy"}
    parts = [f"{names[k]} {phases[k]:.1f}" for k in names if k in phases]
    rest = total_s - sum(phases.values())
    return f"{total_s:.1f} s ({', '.join([*parts, f'the rest {rest:.1f}'])})"


def _all_done(done, experiments, names, shape, dtype) -> bool:
    return all(_key(e, n, shape, dtype) in done for e in experiments for n in names)


def _run_kernel(
    recorder,
    kernel: str,
    dtype: torch.dtype,
    shapes,
    *,
    liger,
    done: set,
    budget: dict,
    with_compile: bool,
    stats: dict,
    failures: list,
) -> None:
    """Every shape of one kernel in one dtype: device and eager time of fwd and fwd+bwd, per variant."""
    dev = torch.device(recorder.device)
    op, eager, mahia = OP[kernel], _REFERENCE[kernel], _MAHIA[kernel]
    for shape in shapes:
        t0 = time.perf_counter()
        names = [v.name for v in _variants(op, eager, mahia, dev, liger, with_compile=False)]
        names += ["torch.compile"] if with_compile else []
        exps = [f"{kernel}_{p}{s}" for p in PASSES for s in ("", "_eager")]
        big = input_bytes(kernel, shape, dtype) >= COPY_MIN_BYTES and dev.type == "cuda"
        copies = [f"{kernel}_{p}" for p in PASSES] if big else []
        if _all_done(done, exps, names, shape, dtype) and _all_done(done, copies, ["copy_same_bytes"], shape, dtype):
            stats["skipped"] += 1
            continue
        if with_compile:
            torch._dynamo.reset()  # compile per shape, and never hit Dynamo's recompile limit
        variants = _variants(op, eager, mahia, dev, liger, with_compile=with_compile)
        phases: dict = {}
        for p in PASSES:
            exp = f"{kernel}_{p}"
            _measure(
                recorder,
                exp,
                variants,
                lambda shape=shape: make_inputs(kernel, shape, dtype, dev),
                eager,
                backward=p == "fwdbwd",
                grad_inputs=GRAD_INPUTS[kernel],
                nbytes=min_bytes(exp, shape, dtype),
                shape=shape,
                dtype=dtype,
                modes={"device": exp, "eager": f"{exp}_eager"},
                done=done,
                copy=big,
                budget=budget,
                failures=failures,
                phases=phases,
            )
        del variants
        _free(dev)
        stats["shapes"] += 1
        print(
            f"  -- {kernel} {_shape_str(shape)} {_dtype_str(dtype)}: {_phase_text(time.perf_counter() - t0, phases)}",
            flush=True,
        )


def _run_host(
    recorder, dtype: torch.dtype, *, liger, done: set, budget: dict, with_compile: bool, stats: dict, failures: list
) -> None:
    """Host cost: eager per-call time of every variant on a tiny tensor, inputs requiring grad."""
    dev = torch.device(recorder.device)
    for kernel in KERNELS:
        shape = HOST_SHAPE[kernel]
        if with_compile:
            torch._dynamo.reset()
        variants = _variants(OP[kernel], _REFERENCE[kernel], _MAHIA[kernel], dev, liger, with_compile=with_compile)
        for p in PASSES:
            exp = f"{kernel}_host_{p}"
            _measure(
                recorder,
                exp,
                variants,
                lambda k=kernel, s=shape: make_inputs(k, s, dtype, dev),
                _REFERENCE[kernel],
                backward=p == "fwdbwd",
                grad_inputs=GRAD_INPUTS[kernel],
                requires_grad=True,
                nbytes=min_bytes(exp, shape, dtype),
                shape=shape,
                dtype=dtype,
                modes={"eager": exp},
                done=done,
                copy=False,
                budget=budget,
                failures=failures,
            )
        stats["shapes"] += 1
    _free(dev)


def _plan_text(parts: list[Part], quick: bool) -> str:
    lines = []
    for p in parts:
        est = "" if quick else f"  (~{EST_MIN_H100.get(p.name, float('nan')):.1f} min on an H100)"
        if p.kernel is None:
            what = ", ".join(f"{k} {_shape_str(HOST_SHAPE[k])}" for k in KERNELS)
            lines.append(f"  {p.name:18s} eager time of fwd and fwd+bwd (inputs require grad): {what}{est}")
        else:
            lines.append(
                f"  {p.name:18s} {len(_grid(p.kernel, quick))} shapes x (fwd, fwd+bwd) x (device, eager time){est}"
            )
    if not quick:
        total = sum(EST_MIN_H100.get(p.name, 0.0) for p in parts)
        lines.append(f"  total ~{total:.1f} min on an H100, + ~0.4 min per command (one lent GPU command: 10 min)")
    return "\n".join(lines)


def run(recorder, ceilings, *, quick: bool, parts: Iterable[str] | str | None = None, resume: bool = True) -> None:
    """Benchmark the kernels on ``recorder.device`` and record two rows (device, eager time) per variant,
    pass, shape and dtype of the selected ``parts`` (default: ``MAHIA_BENCH_PARTS``, else all).

    ``resume``: skip records this commit and profile already have in the suite's CSV. ``ceilings``
    (mahia.measure.hardware.Ceilings) is what ``recorder`` divides achieved GB/s by.
    """
    t_start = time.perf_counter()
    dev = torch.device(recorder.device)
    if os.environ.get("MAHIA_BENCH_FRESH") == "1":
        resume = False
    spec = parts if parts is not None else (os.environ.get("MAHIA_BENCH_PARTS") or None)
    listing = spec is not None and "list" in [
        t.strip() for s in ([spec] if isinstance(spec, str) else spec) for t in str(s).split(",")
    ]
    if listing:
        spec = [
            t.strip()
            for s in ([spec] if isinstance(spec, str) else spec)
            for t in str(s).split(",")
            if t.strip() not in ("list", "")
        ] or None
    chosen = select_parts(spec)
    if quick:  # a smoke test: float32 only
        chosen = [p for p in chosen if p.dtype is None or p.dtype == torch.float32]
    if listing:
        print("kernels: plan (nothing measured)\n" + _plan_text(chosen, quick))
        return
    if dev.type != "cuda" and not quick:
        print("kernels: skipped: these are GPU kernels; on the CPU run with --quick (tiny shapes, smoke test)")
        return
    copy_gbps = getattr(ceilings, "copy_gbps", None)
    if copy_gbps:
        print(f"  measured copy bandwidth: {copy_gbps:,.0f} GB/s")
    cuda = dev.type == "cuda"
    liger = _liger_ops() if cuda else None
    with_compile = cuda
    budget = QUICK_BUDGET if quick else {**DEVICE_BUDGET, **EAGER_BUDGET}
    done = _done(recorder) if resume else set()
    skipped = []
    if not cuda:
        skipped.append("torch.compile (CPU: Inductor's C++ compile costs seconds per shape)")
        skipped.append("liger (Liger-Kernel's kernels are Triton GPU kernels)")
        skipped.append("copy_same_bytes (a GPU memory-bandwidth limit)")
    elif liger is None:
        skipped.append("liger (does not import)")
    if not ops.triton_available_for(torch.empty(0, device=dev)):
        skipped.append(f"mahia_triton ({ops.why_not(torch.empty(0, device=dev))})")
    elif not cuda:
        print("  mahia_triton: TRITON_INTERPRET=1, the CPU interpreter: a smoke test, not a performance figure")
    print(
        f"kernels ({'quick, tiny shapes' if quick else 'full sweep'}, {dev}): parts "
        f"{', '.join(p.name for p in chosen) or 'none'}"
        + (f"; {len(done)} records of commit {recorder.commit} already there: skipped" if done else "")
    )
    print(_plan_text(chosen, quick))
    for s in skipped:
        print(f"  skipped: {s}")
    stats = {"shapes": 0, "skipped": 0}
    failures: list[str] = []
    for p in chosen:
        t0 = time.perf_counter()
        before = len(recorder.rows)
        print(f"== part {p.name}", flush=True)
        if p.kernel is None:
            dtype = torch.bfloat16 if cuda else torch.float32
            _run_host(
                recorder,
                dtype,
                liger=liger,
                done=done,
                budget=budget if quick else EAGER_BUDGET,
                with_compile=with_compile,
                stats=stats,
                failures=failures,
            )
        else:
            _run_kernel(
                recorder,
                p.kernel,
                p.dtype,
                _grid(p.kernel, quick),
                liger=liger,
                done=done,
                budget=budget,
                with_compile=with_compile,
                stats=stats,
                failures=failures,
            )
        print(
            f"== part {p.name}: {len(recorder.rows) - before} records in {time.perf_counter() - t0:.0f} s", flush=True
        )
    print(
        f"kernels: {len(recorder.rows)} records, {stats['shapes']} shapes measured, {stats['skipped']} "
        f"already recorded, {time.perf_counter() - t_start:.0f} s"
    )
    if quick:
        print("  figures: not drawn in --quick (kernels.plot(records, folder) draws them from the CSV)")
    elif recorder.rows or stats["skipped"]:
        paths = plot_recorded(recorder, chosen)
        if paths:
            print(f"  figures: {', '.join(str(p) for p in paths[::2])} (+ .svg)")
    if recorder.rows or stats["skipped"]:
        path = write_summary(recorder.folder, recorder.profile)
        print(f"  summary keys: {path} (merged into the folder's summary by mahia.measure.results)")
    if failures:
        raise CorrectnessError(
            f"kernels: {len(failures)} variant(s) failed their check and were not timed "
            "(the others were measured and recorded):\n  " + "\n  ".join(failures)
        )
