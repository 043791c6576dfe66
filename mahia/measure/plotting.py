"""Plots the notebooks share: bars with their 20-80% spread, sweeps, the roofline under the measured ceilings.

A colour names a variant, never a role: :func:`palette_for` gives a name the fixed colour of its first word
("flash causal" keeps the colour of "flash") or one picked by a CRC-32 of it (stable in every process), and a
name whose colour is taken in the plot a free one of the colour-blind-safe ``PALETTE``. ``ROLE_COLORS`` is for drawings
that colour by role themselves (timelines, waterfalls).
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import ticker as mticker
from matplotlib.colors import to_hex

from mahia.measure.hardware import Ceilings

__all__ = ["ROLE_COLORS", "PALETTE", "palette_for", "bars", "sweep", "roofline", "save", "comparison_table"]

ROLE_COLORS = {
    "baseline": "#c44e52",
    "optimized": "#55a868",
    "peer": "#4c72b0",
    "reference": "#8172b2",
    "metric": "#937860",
}
# seaborn's "colorblind" ten (after Okabe and Ito): safe for the common colour-vision deficiencies
PALETTE = ("#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#fbafe4", "#949494", "#ece133", "#56b4e9")

# Names that recur across notebooks keep one colour: the usual "before" paths vermillion, the project's own bluish
# green, the peers other hues; ``measured`` black, ``predicted`` grey. Any other name is hashed.
_FIXED = {
    "#d55e00": "eager baseline loop manual naive branch per-expert train_syncing fp32 float32 none",
    "#029e73": "mahia mahia_triton triton sdpa grouped batched masked foreach cuda_graph optimized sync_free "
    "train_sync_free bf16 bfloat16 full",
    "#0173b2": "f.rms_norm masked+plan logspace chunked flash fp16 float16 selective",
    "#cc78bc": "torch.compile default compile_reduce_overhead cudnn tf32",
    "#de8f05": "liger efficient keep_attention max-autotune-no-cudagraphs grouped_moe",
    "#56b4e9": "bucketed_graphs reduce-overhead",
    "#ca9161": "math max-autotune",
    "#000000": "measured",
    "#949494": "predicted",
}
_FIXED_COLOR = {name: color for color, names in _FIXED.items() for name in names.split()}

# seaborn's whitegrid look from matplotlib's copy of its styles: no seaborn import (it imports scipy.stats too)
plt.style.use(
    ["seaborn-v0_8-whitegrid", "seaborn-v0_8-notebook", {"legend.frameon": True, "figure.figsize": (6.4, 4.8)}]
)
mpl.rcParams["axes.prop_cycle"] = mpl.cycler(color=PALETTE)


def _key(name) -> str:
    """Lower-case, a trailing " (...)" left out, the first word: the part of a name that picks its colour."""
    s = re.sub(r"\s*\([^()]*\)$", "", str(name).strip().lower()) or str(name).lower()
    return s.split(" ", 1)[0]


def palette_for(names: Iterable) -> dict:
    """``{name: colour}`` for the names of one plot, whatever their order: each takes its hashed colour unless a
    name before it (sorted) took it; those left take the free colours no name of the plot hashes to, then any."""
    unique = list(dict.fromkeys(n for n in names if not (isinstance(n, float) and math.isnan(n))))
    order = sorted(unique, key=lambda n: (_key(n) not in _FIXED_COLOR, _key(n), str(n)))  # fixed names first
    want = {n: _FIXED_COLOR.get(_key(n)) or PALETTE[zlib.crc32(_key(n).encode()) % len(PALETTE)] for n in unique}
    used: dict = {}
    for n in order:
        if want[n] not in used.values():
            used[n] = want[n]
    spare = [c for c in PALETTE if c not in want.values()] + list(PALETTE)
    hues = plt.get_cmap("hsv")(np.linspace(0, 1, len(unique), endpoint=False))  # for more names than PALETTE holds
    spare += [to_hex(c) for c in hues]
    for n in order:
        used[n] = used.get(n) or next(c for c in spare if c not in used.values())
    return {n: used[n] for n in unique}


def _title(title: str, device_note: str | None) -> str:
    return f"{title}\n{device_note}" if device_note else title


class _PlainLogFormatter(mticker.LogFormatter):
    """A log axis's labels as plain numbers ("0.6", "2", "100"), not "6 × 10⁻¹"."""

    def _num_to_string(self, x, vmin, vmax):
        return f"{x:g}"


def _plain_log(axis) -> None:
    """Plain numbers on a log axis; the 2, 3, 4, 6 between decades too where it spans about a decade or less."""
    axis.set_major_formatter(_PlainLogFormatter())
    axis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def bars(
    df: pd.DataFrame,
    *,
    title: str,
    value: str = "median_ms",
    ax=None,
    device_note: str | None = None,
    log: bool = False,
    palette: dict | None = None,
):
    """Horizontal bars of ``value`` per ``variant`` (first row on top), with 20-80% whiskers for a time; each
    value is written beyond its whisker, and the axis keeps room for it."""
    if df.empty:
        raise ValueError("bars(): no records to plot")
    d = df.reset_index(drop=True)
    ax = ax or plt.subplots(figsize=(7, 0.45 * len(d) + 1.4))[1]
    y = np.arange(len(d))
    pal = palette_for(d["variant"]) | (palette or {})
    vals = pd.to_numeric(d[value], errors="coerce").to_numpy(dtype=float)
    ax.barh(y, vals, color=[pal[v] for v in d["variant"]])
    ends = vals
    if value == "median_ms" and {"p20_ms", "p80_ms"} <= set(d.columns):
        p20, p80 = (pd.to_numeric(d[c], errors="coerce").to_numpy(dtype=float) for c in ("p20_ms", "p80_ms"))
        err = np.vstack([vals - p20, p80 - vals]).clip(min=0)
        ax.errorbar(vals, y, xerr=err, fmt="none", ecolor="black", capsize=3, lw=1)
        ends = np.fmax(vals, p80)  # a NaN p80: the bar's end
    for yi, v, end in zip(y, vals, ends):
        if math.isfinite(v) and (v > 0 or not log):
            text = f"{v:,.0f}" if abs(v) >= 99.95 else f"{v:#.3g}"  # three significant digits: "67.0"
            ax.annotate(text, (end, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=9)
    ax.margins(x=0.2)  # room for the labels (bars keep their left edge at 0)
    ax.set_yticks(y, d["variant"])
    if not ax.yaxis_inverted():  # once: panels that share a y axis invert it together
        ax.invert_yaxis()
    labels = {"median_ms": "time (ms, median; whiskers 20th-80th pct)", "gbps": "GB/s", "tflops": "TFLOP/s"}
    ax.set_xlabel(labels.get(value, "fraction of measured limit" if value == "frac_of_limit" else value))
    if log:
        ax.set_xscale("log")
        _plain_log(ax.xaxis)
    ax.set_title(_title(title, device_note))
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
    """Lines of ``y`` against ``x`` per ``hue``: a categorical hue coloured by :func:`palette_for`, a numeric one
    by an ordered map (viridis); ``limit`` draws a dashed ceiling."""
    if df.empty:
        raise ValueError("sweep(): no records to plot")
    ax = ax or plt.subplots(figsize=(7, 4))[1]
    if palette is None and hue in df.columns and not pd.api.types.is_numeric_dtype(df[hue]):
        palette = palette_for(df[hue].dropna())
    groups = list(df.groupby(hue, sort=pd.api.types.is_numeric_dtype(df[hue]))) if hue in df.columns else [(None, df)]
    if palette is None and hue in df.columns:  # a numeric hue: an ordered map, light to dark
        values = [k for k, _ in groups]
        palette = dict(zip(values, plt.get_cmap("viridis_r")(np.linspace(0.15, 0.9, len(values)))))
    for key, g in groups:  # without a hue column (key None): one line in the style's first colour
        line = g.groupby(x, sort=True)[y].mean()  # repeated x: their mean
        color, label = (None, None) if key is None else (palette.get(key), str(key))
        ax.plot(line.index, line.values, marker="o", color=color, label=label)
    ax.set(xlabel=x, ylabel=y)
    if hue in df.columns:
        ax.legend(title=hue or None)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
        _plain_log(ax.yaxis)
    if limit is not None:  # after the scales: the label's x is the axis's left end
        ax.axhline(limit, color="black", ls="--", lw=1)
        ax.annotate(limit_label or "measured limit", (ax.get_xlim()[0], limit), va="bottom", fontsize=9)
    ax.set_title(_title(title, device_note))
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
    """Achieved TFLOP/s against arithmetic intensity (FLOP/byte) under the measured roof
    ``min(peak, bandwidth x intensity)``; ``points`` has ``variant``, ``flops``, ``bytes``, ``median_ms``. A point
    within 0.03 decades of one drawn before it is drawn smaller on top, so that neither hides the other."""
    need = {"variant", "flops", "bytes", "median_ms"}
    if not need <= set(points.columns):
        raise ValueError(f"roofline(): points need columns {sorted(need)}")
    p = points.dropna(subset=["flops", "bytes", "median_ms"])
    p = p[(p["flops"] > 0) & (p["bytes"] > 0)]
    intensity, achieved = p["flops"] / p["bytes"], p["flops"] / (p["median_ms"] * 1e-3) / 1e12
    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    peak, bw = ceilings.limit(matmul), ceilings.copy_gbps / 1e3  # TB/s: TFLOP/s per FLOP/byte
    xs = np.logspace(np.log10(min([0.05, *intensity / 2])), np.log10(max([peak / bw * 8, *intensity * 2])), 200)
    label = f"measured roof: {ceilings.copy_gbps:.4g} GB/s, {peak:.4g} TFLOP/s ({matmul})"
    ax.plot(xs, np.minimum(peak, bw * xs), color="black", lw=2, label=label)
    pal, drawn = palette_for(p["variant"]), []
    for name, ix, ac in zip(p["variant"], intensity, achieved):
        lx, ly = np.log10(ix), np.log10(ac)
        on_top = any(abs(lx - a) < 0.03 and abs(ly - b) < 0.03 for a, b in drawn)
        drawn.append((lx, ly))
        ax.scatter(ix, ac, s=18 if on_top else 50, zorder=4 if on_top else 3, color=pal[name])
        ax.annotate(f" {name}", (ix, ac), fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte)", ylabel="TFLOP/s")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(_title(title, device_note))
    return ax


def save(fig_or_ax, name: str, folder: str | Path) -> list[Path]:
    """Save as ``<folder>/<name>.png`` and ``.svg``; returns the paths."""
    fig = fig_or_ax if hasattr(fig_or_ax, "savefig") else fig_or_ax.figure
    Path(folder).mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    paths = [Path(folder) / f"{name}.{ext}" for ext in ("png", "svg")]
    for p in paths:
        fig.savefig(p, dpi=120 if p.suffix == ".png" else None)
    return paths


def comparison_table(
    df: pd.DataFrame,
    baseline: str | None = None,
    columns: Sequence[str] = (
        *("variant", "role", "median_ms", "p20_ms", "p80_ms"),
        *("gbps", "tflops", "frac_of_limit", "peak_mem_mb", "rel_err"),
    ),
) -> pd.DataFrame:
    """Records as a table: ``columns`` that hold a value, and the speedup over ``baseline`` (default: the row
    whose role is "baseline")."""
    t = df[[c for c in columns if c in df.columns]].reset_index(drop=True)
    base = baseline or next(iter(df.loc[df["role"] == "baseline", "variant"]), None)
    if base is not None and (t["variant"] == base).any():
        t["speedup"] = float(t.loc[t["variant"] == base, "median_ms"].iloc[0]) / t["median_ms"]
    return t.dropna(axis=1, how="all")
