"""The kernel benchmark's summary keys (issue 13's goals) and figures."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from mahia.bench.kernels.shapes import HEADLINE, KERNELS, MB, PASSES, PEER_ROLES, Part, _shape_str, input_bytes
from mahia.measure import files, results

# ------------------------------------------------------------------------------------------- summary

SUMMARY_STEM = "bench_kernels_summary"  # mahia.measure.results reads <folder>/<stem>[-<profile>].json
EAGER_WORST_MIN_BYTES = 16 * MB
DEVICE_WORST_MIN_BYTES = 8 * MB
COPY_FRAC_MIN_BYTES = 64 * MB


def newest_rows(df):
    """Newest row per (experiment, variant, shape, dtype)."""
    if df.empty:
        return df
    d = df.copy()
    for c in ("shape", "dtype", "experiment", "variant"):
        d[c] = d[c].astype(str)
    if "date" in d.columns:
        d = d.sort_values("date", kind="stable")
    return d.groupby(["experiment", "variant", "shape", "dtype"], sort=False).tail(1)


def _parse_shape(s: str) -> tuple[int, ...]:
    return tuple(int(v) for v in str(s).split("x"))


def _dtype_of(name: str) -> torch.dtype | None:
    return getattr(torch, str(name), None) if str(name) in ("bfloat16", "float16", "float32", "float64") else None


def _vs_best_peer(g) -> float | None:
    """time(best peer) / time(mahia_triton) in the rows ``g`` of one experiment, shape and dtype."""
    t = g[g["median_ms"].notna()]
    mine = t[t["variant"] == "mahia_triton"]
    peers = t[t["role"].isin(PEER_ROLES)]
    if mine.empty or peers.empty:
        return None
    return float(peers["median_ms"].min()) / float(mine["median_ms"].iloc[0])


def _frac_of_copy(g) -> float | None:
    """mahia_triton's fraction of the copy ceiling / the same-bytes copy's: its GB/s over the copy's."""
    mine = g[(g["variant"] == "mahia_triton") & g["frac_of_limit"].notna()]
    cp = g[(g["variant"] == "copy_same_bytes") & g["value"].notna()]
    if mine.empty or cp.empty or not float(cp["value"].iloc[0]) > 0:
        return None
    return float(mine["frac_of_limit"].iloc[0]) / float(cp["value"].iloc[0])


def _over_shapes(df, experiments, fn, min_bytes_: float, dtypes=None) -> tuple[float | None, dict | None]:
    """The smallest ``fn`` over (experiment, shape, dtype) groups whose input is at least ``min_bytes_``."""
    worst, where = None, None
    sel = df[df["experiment"].isin(experiments)]
    for (exp, shape, dt), g in sel.groupby(["experiment", "shape", "dtype"], sort=False):
        dtype = _dtype_of(dt)
        if dtype is None or (dtypes is not None and dt not in dtypes):
            continue
        try:
            size = input_bytes(exp, _parse_shape(shape), dtype)
        except (ValueError, TypeError):
            continue
        if size < min_bytes_:
            continue
        v = fn(g)
        if v is not None and not math.isnan(v) and (worst is None or v < worst):
            worst, where = v, {"experiment": exp, "shape": shape, "dtype": dt}
    return worst, where


def summary_keys(records, *, where: bool = False) -> dict:
    """The kernel benchmark's summary keys from its records (``load_records`` of a device folder, one
    profile; the newest row per experiment, variant, shape and dtype is used). ``x_vs_y`` = time(y) /
    time(x), y the best peer (the fastest variant of a role in PEER_ROLES, eager PyTorch included, at
    that shape and dtype); above 1 means mahia is faster. None where the records are missing. With ``where=True`` each value comes as
    ``{"value", "experiment", "shape", "dtype"}`` (which shape made a worst case).

    rmsnorm_host_fwd[bwd]_vs_native     time(F.rms_norm) / time(mahia_triton), eager time, tiny tensor
                                        (rmsnorm_host_fwd[bwd], bfloat16 if recorded, else any dtype)
    <k>_fwdbwd_eager_vs_best_peer       <k>_fwdbwd_eager at the headline shape (HEADLINE), bfloat16;
                                        k = rmsnorm, swiglu, rope
    <k>_fwdbwd_eager_worst_vs_best_peer the smallest such ratio over every shape with an input of at least
                                        16 MB, all dtypes (<k>_fwdbwd_eager)
    <k>_device_worst_vs_best_peer       the smallest ratio of device time over <k>_fwd and <k>_fwdbwd,
                                        every shape with an input of at least 8 MB, all dtypes
    rmsnorm_fwdbwd_frac_of_copy         mahia_triton's GB/s / the same-bytes copy's (rmsnorm_fwdbwd, device
                                        time, 16384x4096 bfloat16): frac_of_limit / copy_same_bytes value
    rmsnorm_fwd_worst_frac_of_copy      the smallest such fraction for rmsnorm_fwd over every shape with an
                                        input of at least 64 MB, all dtypes
    """
    import pandas as pd

    df = (
        newest_rows(pd.DataFrame(records))
        if len(records)
        else pd.DataFrame(
            columns=["experiment", "variant", "role", "shape", "dtype", "median_ms", "frac_of_limit", "value"]
        )
    )
    out: dict = {}

    def put(key, value, loc=None):
        value = None if value is None or math.isnan(value) else float(value)
        out[key] = {"value": value, **(loc or {})} if where else value

    def at(experiment, shape, dtype):
        return df[(df["experiment"] == experiment) & (df["shape"] == shape) & (df["dtype"] == dtype)]

    for p in PASSES:
        exp = f"rmsnorm_host_{p}"
        sel = df[df["experiment"] == exp]
        value, loc = None, None
        if not sel.empty:
            dts = ["bfloat16"] if (sel["dtype"] == "bfloat16").any() else sorted(set(sel["dtype"]))
            for (shape, dt), g in sel[sel["dtype"].isin(dts)].groupby(["shape", "dtype"], sort=False):
                t = g[g["median_ms"].notna()].set_index("variant")["median_ms"]
                if "F.rms_norm" in t.index and "mahia_triton" in t.index:
                    value, loc = (
                        float(t["F.rms_norm"]) / float(t["mahia_triton"]),
                        {"experiment": exp, "shape": shape, "dtype": dt},
                    )
                    break
        put(f"rmsnorm_host_{p}_vs_native", value, loc)
    for k in ("rmsnorm", "swiglu", "rope"):
        exp, shape = f"{k}_fwdbwd_eager", _shape_str(HEADLINE[k])
        put(
            f"{k}_fwdbwd_eager_vs_best_peer",
            _vs_best_peer(at(exp, shape, "bfloat16")),
            {"experiment": exp, "shape": shape, "dtype": "bfloat16"},
        )
    for k in ("rmsnorm", "swiglu", "rope"):
        put(
            f"{k}_fwdbwd_eager_worst_vs_best_peer",
            *_over_shapes(df, [f"{k}_fwdbwd_eager"], _vs_best_peer, EAGER_WORST_MIN_BYTES),
        )
    for k in ("rmsnorm", "swiglu", "rope"):
        put(
            f"{k}_device_worst_vs_best_peer",
            *_over_shapes(df, [f"{k}_fwd", f"{k}_fwdbwd"], _vs_best_peer, DEVICE_WORST_MIN_BYTES),
        )
    shape = _shape_str(HEADLINE["rmsnorm"])
    put(
        "rmsnorm_fwdbwd_frac_of_copy",
        _frac_of_copy(at("rmsnorm_fwdbwd", shape, "bfloat16")),
        {"experiment": "rmsnorm_fwdbwd", "shape": shape, "dtype": "bfloat16"},
    )
    put("rmsnorm_fwd_worst_frac_of_copy", *_over_shapes(df, ["rmsnorm_fwd"], _frac_of_copy, COPY_FRAC_MIN_BYTES))
    return out


def write_summary(folder: str | Path, profile: str) -> Path:
    """Write :func:`summary_keys` of the folder's kernel records of ``profile`` to ``<folder>/
    bench_kernels_summary.json`` (``-<profile>`` for other than full), with where each worst case is
    and the commits of the records. :func:`mahia.measure.results.headline` merges these keys into the
    folder's ``summary.json``: the rules live here, beside the experiments they read, and the results
    floor reads only the file."""
    df = results.load_records(folder)
    if not df.empty:
        df = df[(df["notebook"] == "bench_kernels") & (df["profile"] == profile)]
    keys = summary_keys(df, where=True)
    doc = {
        "profile": profile,
        "commits": sorted(set(df["commit"].astype(str))) if not df.empty else [],
        "metrics": {k: v["value"] for k, v in keys.items()},
        "where": {k: {f: v[f] for f in ("experiment", "shape", "dtype") if f in v} for k, v in keys.items()},
    }
    path = files.profile_file(folder, SUMMARY_STEM, profile)
    files.atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
    return path


# ------------------------------------------------------------------------------------------- plots


def plot(
    records,
    folder: str | Path,
    *,
    prefix: str = "bench_kernels",
    kernels: Iterable[str] | None = None,
    host: bool = True,
) -> list[Path]:
    """One figure per kernel: rows = dtypes, columns = (fwd, fwd+bwd) x (device, eager time); each panel
    the fraction of the copy ceiling (GB/s on the fewest bytes when no ceiling was known) against the
    input size, a line per variant, and the same-bytes copy as a dashed black line. Plus one figure of
    the host cost (eager per-call time on the tiny tensor). Saved as ``<folder>/<prefix>_<kernel>.png``
    and ``.svg``; returns the paths. ``kernels`` (default all) and ``host`` choose the figures."""
    import pandas as pd

    from mahia.measure import plotting

    plt = plotting.plt

    df = newest_rows(pd.DataFrame(records))
    paths: list[Path] = []
    if df.empty:
        return paths
    colors = plotting.palette_for(df["variant"])  # one colour per variant in every panel and figure
    for kernel in [k for k in KERNELS if kernels is None or k in set(kernels)]:
        sub = df[df["experiment"].isin([f"{kernel}_{p}{s}" for p in PASSES for s in ("", "_eager")])]
        if sub.empty:
            continue
        dts = [d for d in ("bfloat16", "float16", "float32") if (sub["dtype"] == d).any()]
        use_frac = sub["frac_of_limit"].notna().any()
        fig, axes = plt.subplots(len(dts), 4, figsize=(18, 3.6 * len(dts) + 0.8), squeeze=False, sharex=True)
        for i, dt in enumerate(dts):
            dtype = _dtype_of(dt)
            for j, (p, s) in enumerate((("fwd", ""), ("fwd", "_eager"), ("fwdbwd", ""), ("fwdbwd", "_eager"))):
                ax = axes[i, j]
                exp = f"{kernel}_{p}{s}"
                g = sub[(sub["experiment"] == exp) & (sub["dtype"] == dt)].copy()
                if g.empty:
                    ax.set_visible(False)
                    continue
                g["size_mb"] = [input_bytes(kernel, _parse_shape(sh), dtype) / MB for sh in g["shape"]]
                g = g.sort_values("size_mb")
                for name, gv in g[g["median_ms"].notna()].groupby("variant", sort=False):
                    y = gv["frac_of_limit"] if use_frac else gv["gbps"]
                    ax.plot(gv["size_mb"], y, marker="o", ms=3, lw=1, label=name, color=colors[name])
                cp = sub[
                    (sub["experiment"] == f"{kernel}_{p}")
                    & (sub["dtype"] == dt)
                    & (sub["variant"] == "copy_same_bytes")
                ].copy()
                if use_frac and not cp.empty:
                    cp["size_mb"] = [input_bytes(kernel, _parse_shape(sh), dtype) / MB for sh in cp["shape"]]
                    cp = cp.sort_values("size_mb")
                    ax.plot(cp["size_mb"], cp["value"], color="black", ls="--", lw=1, label="copy, same bytes")
                ax.set_xscale("log")
                ax.set_title(f"{kernel} {p} {dt}: {'eager' if s else 'device'} time", fontsize=10)
                if j == 0:
                    ax.set_ylabel("fraction of copy ceiling" if use_frac else "GB/s (fewest bytes)")
                if i == len(dts) - 1:
                    ax.set_xlabel("input size (MB)")
                ax.legend(fontsize=7)
        fig.suptitle(
            f"{kernel}: device time (CUDA graph replay) and eager time (back-to-back calls) "
            f"per variant; {df['device'].iloc[0] if 'device' in df.columns else ''}",
            fontsize=11,
        )
        paths += plotting.save(fig, f"{prefix}_{kernel}", folder)
        plt.close(fig)
    host_rows = df[df["experiment"].str.contains("_host_") & df["median_ms"].notna()]
    if host and not host_rows.empty:
        host = host_rows
        exps = list(dict.fromkeys(host["experiment"]))
        fig, axes = plt.subplots(len(exps), 1, figsize=(7, 1.6 + 1.5 * len(exps)), squeeze=False)
        for ax, exp in zip(axes[:, 0], exps, strict=True):
            g = host[host["experiment"] == exp].copy()
            g["us"] = g["median_ms"] * 1e3
            plotting.bars(
                g.rename(columns={"us": "µs per call"}),
                value="µs per call",
                ax=ax,
                title=f"{exp} {g['shape'].iloc[0]} {g['dtype'].iloc[0]}",
            )
        fig.suptitle("host cost: eager per-call time on a tiny tensor (inputs require grad)", fontsize=10)
        paths += plotting.save(fig, f"{prefix}_host", folder)
        plt.close(fig)
    return paths


def plot_recorded(recorder, parts: Sequence[Part] | None = None) -> list[Path]:
    """:func:`plot` of this commit's and profile's records in the recorder's CSV, into the figures folder
    (``mahia.measure.files.default_figures_dir() / <device slug>``): the figures of ``parts``' kernels
    (default all), each with every dtype recorded so far."""
    import pandas as pd

    from mahia.measure import files

    path = Path(recorder.path)
    if not path.exists():
        return []
    df = pd.read_csv(path, dtype={"shape": str, "dtype": str, "commit": str, "profile": str})
    for col, want in (("commit", getattr(recorder, "commit", None)), ("profile", getattr(recorder, "profile", None))):
        if want is not None and col in df.columns:
            df = df[df[col].astype(str) == str(want)]
    folder = files.default_figures_dir() / recorder.slug
    files.check_writable(folder)
    if parts is None:
        return plot(df, folder)
    return plot(df, folder, kernels={p.kernel for p in parts if p.kernel}, host=any(p.kernel is None for p in parts))
