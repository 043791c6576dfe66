"""Plots every notebook uses: before/after bars with spread, sweeps, and the roofline.

Figures are saved as PNG and SVG under ``figures/<device-slug>/`` by ``save``. The functions take
the DataFrame of records written by ``mahia.measure.results`` (``Recorder.frame()`` or ``load_records``),
so a plot always shows what was measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

if matplotlib.get_backend().lower() not in (
    "module://matplotlib_inline.backend_inline",
    "nbagg",
    "widget",
    "module://ipympl.backend_nbagg",
):
    matplotlib.use("Agg")  # headless runs (papermill, CI) have no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from mahia.measure.hardware import Ceilings  # noqa: E402

__all__ = ["ROLE_COLORS", "bars", "sweep", "roofline", "save"]

ROLE_COLORS = {
    "baseline": "#c44e52",
    "optimized": "#55a868",
    "peer": "#4c72b0",
    "reference": "#8172b2",
    "metric": "#937860",
}
sns.set_theme(style="whitegrid", context="notebook")


def _label(device_note: str | None, title: str) -> str:
    return f"{title}\n{device_note}" if device_note else title


def bars(
    df: pd.DataFrame,
    *,
    title: str,
    value: str = "median_ms",
    ax=None,
    device_note: str | None = None,
    log: bool = False,
):
    """Horizontal bars of ``value`` per variant, coloured by role, with 20-80 percentile whiskers
    when ``value`` is a time."""
    if df.empty:
        raise ValueError("bars(): no records to plot")
    d = df.reset_index(drop=True)
    ax = ax or plt.subplots(figsize=(7, 0.45 * len(d) + 1.4))[1]
    y = np.arange(len(d))
    colors = [ROLE_COLORS.get(r, "#777777") for r in d["role"]]
    ax.barh(y, d[value], color=colors)
    if value == "median_ms" and {"p20_ms", "p80_ms"} <= set(d.columns):
        err = np.vstack([d["median_ms"] - d["p20_ms"], d["p80_ms"] - d["median_ms"]]).clip(min=0)
        ax.errorbar(d["median_ms"], y, xerr=err, fmt="none", ecolor="black", capsize=3, lw=1)
    ax.set_yticks(y, d["variant"])
    ax.invert_yaxis()
    ax.set_xlabel(
        {
            "median_ms": "time (ms, median; whiskers 20th-80th pct)",
            "gbps": "GB/s",
            "tflops": "TFLOP/s",
            "frac_of_limit": "fraction of measured limit",
        }.get(value, value)
    )
    if log:
        ax.set_xscale("log")
    ax.set_title(_label(device_note, title))
    for yi, v in zip(y, d[value]):
        ax.annotate(f" {v:.3g}", (v, yi), va="center", fontsize=9)
    return ax


def sweep(
    df: pd.DataFrame,
    *,
    x: str,
    y: str = "median_ms",
    hue: str = "variant",
    title: str,
    ax=None,
    logx: bool = True,
    logy: bool = False,
    device_note: str | None = None,
    limit: float | None = None,
    limit_label: str | None = None,
    palette: dict | None = None,
):
    """Lines of ``y`` against ``x`` (a column, e.g. a size parsed from ``shape``) per ``hue``. ``palette``
    ({hue value: colour}) fixes each line's colour, so that it is the same in every panel of a figure."""
    if df.empty:
        raise ValueError("sweep(): no records to plot")
    ax = ax or plt.subplots(figsize=(7, 4))[1]
    sns.lineplot(data=df, x=x, y=y, hue=hue, marker="o", ax=ax, palette=palette)
    if limit is not None:
        ax.axhline(limit, color="black", ls="--", lw=1)
        ax.annotate(limit_label or "measured limit", (ax.get_xlim()[0], limit), va="bottom", fontsize=9)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_title(_label(device_note, title))
    return ax


def roofline(
    points: pd.DataFrame,
    ceilings: Ceilings,
    *,
    title: str = "Roofline",
    ax=None,
    matmul: str = "matmul_bf16",
    device_note: str | None = None,
):
    """Achieved TFLOP/s against arithmetic intensity (FLOP/byte) under the *measured* ceilings.

    ``points`` needs columns ``variant``, ``flops``, ``bytes``, ``median_ms``. Attainable
    performance is min(peak, bandwidth x intensity); a point's distance below the roof is its gap.
    """
    need = {"variant", "flops", "bytes", "median_ms"}
    if not need <= set(points.columns):
        raise ValueError(f"roofline(): points need columns {sorted(need)}")
    p = points.dropna(subset=["flops", "bytes", "median_ms"]).copy()
    p = p[(p["flops"] > 0) & (p["bytes"] > 0)]
    p["intensity"] = p["flops"] / p["bytes"]
    p["achieved"] = p["flops"] / (p["median_ms"] * 1e-3) / 1e12
    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    peak = ceilings.limit(matmul)
    bw = ceilings.copy_gbps / 1e3  # TB/s: TFLOP/s per FLOP/byte
    lo = min(0.05, p["intensity"].min() / 2) if len(p) else 0.05
    hi = max(peak / bw * 8, p["intensity"].max() * 2) if len(p) else peak / bw * 8
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.plot(
        xs,
        np.minimum(peak, bw * xs),
        color="black",
        lw=2,
        label=f"measured roof: {ceilings.copy_gbps:.4g} GB/s, {peak:.4g} TFLOP/s ({matmul})",
    )
    for _, r in p.iterrows():
        ax.scatter(r["intensity"], r["achieved"], s=50, zorder=3, color=ROLE_COLORS.get(r.get("role", ""), None))
        ax.annotate(f" {r['variant']}", (r["intensity"], r["achieved"]), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(_label(device_note, title))
    return ax


def save(fig_or_ax, name: str, folder: str | Path) -> list[Path]:
    """Save as ``<folder>/<name>.png`` and ``.svg``; returns the paths."""
    fig = fig_or_ax.figure if hasattr(fig_or_ax, "figure") and not hasattr(fig_or_ax, "savefig") else fig_or_ax
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    paths = []
    for ext in ("png", "svg"):
        p = folder / f"{name}.{ext}"
        fig.savefig(p, dpi=120 if ext == "png" else None)
        paths.append(p)
    return paths


def parse_shape(df: pd.DataFrame, index: int, name: str) -> pd.DataFrame:
    """Add column ``name`` holding dimension ``index`` of the ``shape`` string ('16384x4096')."""
    out = df.copy()
    out[name] = out["shape"].astype(str).str.split("x").str[index].astype(int)
    return out


def comparison_table(
    df: pd.DataFrame,
    baseline: str | None = None,
    columns: Sequence[str] = (
        "variant",
        "role",
        "median_ms",
        "p20_ms",
        "p80_ms",
        "gbps",
        "tflops",
        "frac_of_limit",
        "peak_mem_mb",
        "rel_err",
    ),
) -> pd.DataFrame:
    """The timing table a notebook shows: selected columns plus speedup against ``baseline``."""
    t = df[[c for c in columns if c in df.columns]].copy().reset_index(drop=True)
    base = baseline or (df[df["role"] == "baseline"]["variant"].iloc[0] if (df["role"] == "baseline").any() else None)
    if base is not None and (t["variant"] == base).any():
        tb = float(t.loc[t["variant"] == base, "median_ms"].iloc[0])
        t["speedup"] = tb / t["median_ms"]
    return t.dropna(axis=1, how="all")
