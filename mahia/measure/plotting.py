"""Plots every notebook uses: before/after bars with spread, sweeps, and the roofline.

Figures are saved as PNG and SVG under ``figures/<device-slug>/`` by ``save``. The functions take
the DataFrame of records written by ``mahia.measure.results`` (``Recorder.frame()`` or ``load_records``),
so a plot always shows what was measured.

Colours: a colour names a variant, never a role. Every function here that colours by variant (``bars``,
``sweep`` with a categorical hue, ``roofline``) takes its colours from :func:`palette_for`, so one name has
one colour in every panel of every notebook, whatever order the plots are drawn in and in every run:

* :func:`variant_color` gives a name its colour: the fixed one in ``VARIANT_COLORS`` for the project's common
  names (looked up lower-cased, a trailing ``" (...)"`` left out, so ``"grouped (optimized)"`` is
  ``grouped``), else one picked by a stable hash of the name (CRC-32, not Python's per-process ``hash``)
  from the colour-blind-safe ``PALETTE`` (Okabe-Ito / seaborn "colorblind", with Paul Tol's indigo, wine
  and olive).
* :func:`palette_for` gives each name of one plot its colour; when two names of the plot would share one,
  the one later in a fixed order (names of ``VARIANT_COLORS`` first, then alphabetical) moves to the next
  free colour of ``PALETTE``. Two names of one plot never share a colour, and a name keeps its colour in
  every plot where it does not collide.
* The fixed names follow the roles without depending on them: the usual "before" variants (eager,
  baseline, loop, manual, naive, branch, fp32, none, ...) are vermillion, the project's own paths
  (mahia_triton, triton, grouped, batched, masked, foreach, cuda_graph, sdpa, bf16, ...) bluish green,
  and the peers (torch.compile, liger, F.rms_norm, cudnn, flash, efficient, math, ...) other hues;
  ``measured`` is black and ``predicted`` grey. A name that has different roles in two notebooks keeps
  one colour. ``ROLE_COLORS`` stays for drawings that colour by role themselves (timelines, waterfalls);
  the functions here never use it for a variant.

Value labels on bars sit beyond the end of the bar's whisker (20th-80th percentile), written by
:func:`format_value` ("2,160", "211", "14.9", "2.16"), and the axis leaves room for them.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterable, Sequence
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
from matplotlib import ticker as mticker  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from mahia.measure.hardware import Ceilings  # noqa: E402

__all__ = [
    "ROLE_COLORS",
    "PALETTE",
    "VARIANT_COLORS",
    "variant_color",
    "palette_for",
    "format_value",
    "bars",
    "sweep",
    "plain_log_ticks",
    "roofline",
    "save",
]

ROLE_COLORS = {
    "baseline": "#c44e52",
    "optimized": "#55a868",
    "peer": "#4c72b0",
    "reference": "#8172b2",
    "metric": "#937860",
}

_BLUE, _ORANGE, _GREEN, _VERMILLION = "#0173b2", "#de8f05", "#029e73", "#d55e00"
_PURPLE, _SKY, _TAN = "#cc78bc", "#56b4e9", "#ca9161"
_INDIGO, _WINE, _OLIVE = "#332288", "#882255", "#999933"
_GREY, _BLACK = "#949494", "#000000"

# Colour-blind-safe colours: the first ones are those a hashed name can get; a name that collides in a plot
# moves to the next free one (grey and black, the colours of "predicted" and "measured", come last).
PALETTE: tuple[str, ...] = (
    _BLUE,
    _ORANGE,
    _GREEN,
    _VERMILLION,
    _PURPLE,
    _SKY,
    _TAN,
    _INDIGO,
    _WINE,
    _OLIVE,
    "#44aa99",  # Paul Tol's teal, cyan, sand, purple, rose and green: only when a plot has used the above
    "#88ccee",
    "#ddcc77",
    "#aa4499",
    "#cc6677",
    "#117733",
    _GREY,
    _BLACK,
)
_HASHED = PALETTE[:10]

_FIXED_GROUPS = {
    _VERMILLION: (
        "eager",
        "baseline",
        "loop",
        "manual",
        "manual causal",
        "naive",
        "branch",
        "per-expert loop",
        "train_syncing",
        "fp32",
        "float32",
        "none",
    ),
    _WINE: ("loops",),
    _GREEN: (
        "mahia_triton",
        "mahia",
        "triton",
        "sdpa",
        "grouped",
        "batched",
        "masked",
        "foreach",
        "cuda_graph",
        "optimized",
        "sync_free",
        "train_sync_free",
        "bf16",
        "bfloat16",
        "full",
    ),
    _BLUE: ("f.rms_norm", "masked+plan", "logspace", "chunked", "flash", "fp16", "float16", "selective"),
    _PURPLE: ("torch.compile", "default", "compile_reduce_overhead", "cudnn", "tf32"),
    _ORANGE: ("liger", "efficient", "keep_attention", "max-autotune-no-cudagraphs", "grouped_moe"),
    _SKY: ("bucketed_graphs", "reduce-overhead"),
    _TAN: ("math", "max-autotune"),
    _INDIGO: ("best_compile",),
    _BLACK: ("measured",),
    _GREY: ("predicted",),
}
VARIANT_COLORS: dict[str, str] = {name: color for color, names in _FIXED_GROUPS.items() for name in names}
"""The fixed colour of each common variant name (keys lower-case, see :func:`variant_color`)."""

sns.set_theme(style="whitegrid", context="notebook")


def _key(name) -> str:
    """The lookup key of a variant name: lower-case, stripped, a trailing ``" (...)"`` left out."""
    s = str(name).strip().lower()
    return re.sub(r"\s*\([^()]*\)$", "", s) or s


def _fixed_color(key: str) -> str | None:
    """The fixed colour of a lookup key: its own, else its first word's, so that a variant qualified by
    more words ("flash causal", "cudnn full") keeps the colour of the variant it qualifies ("flash")."""
    if key in VARIANT_COLORS:
        return VARIANT_COLORS[key]
    return VARIANT_COLORS.get(key.split(" ", 1)[0])


def variant_color(name) -> str:
    """The colour of variant ``name`` (a hex string): its fixed colour from ``VARIANT_COLORS`` (or its first
    word's), else one of ``PALETTE`` picked by a CRC-32 of the name (the same in every process and run). It
    does not avoid the other names of a plot: :func:`palette_for` does."""
    key = _key(name)
    fixed = _fixed_color(key)
    if fixed is not None:
        return fixed
    return _HASHED[zlib.crc32(key.encode("utf-8")) % len(_HASHED)]


def palette_for(names: Iterable) -> dict:
    """``{name: colour}`` for the names of one plot (duplicates and order do not matter): each gets
    :func:`variant_color`, except that when two would share a colour the one later in a fixed order (names
    with a fixed colour first, then alphabetical by name) takes the next free colour of ``PALETTE``."""
    unique = list(dict.fromkeys(n for n in names if not (isinstance(n, float) and math.isnan(n))))
    order = sorted(unique, key=lambda n: (_fixed_color(_key(n)) is None, _key(n), str(n)))
    used: set[str] = set()
    out = {}
    for name in order:
        want = variant_color(name)
        if want in used:
            start = PALETTE.index(want) + 1 if want in PALETTE else 0
            free = [c for c in PALETTE[start:] + PALETTE[:start] if c not in used]
            if free:
                want = free[0]
            else:  # more names than PALETTE: evenly spaced hues, none of them used yet
                extra = [to_hex(c) for c in sns.husl_palette(len(unique) + len(PALETTE))]
                want = next(c for c in extra if c not in used)
        used.add(want)
        out[name] = want
    return {name: out[name] for name in unique}


def format_value(v) -> str:
    """A bar's value as its label: thousands with separators and no exponent ("2,160", "12,345"), 100 to
    999 whole ("211"), smaller with 3 significant digits ("14.9", "2.16", "0.0523", "1.00"); "" for NaN."""
    v = float(v)
    if not math.isfinite(v):
        return ""
    if v == 0:
        return "0"
    r = float(f"{v:.3g}")
    if abs(r) >= 100:
        return f"{v:,.0f}"
    if abs(r) < 1e-4:
        return f"{r:.3g}"
    decimals = max(0, 2 - math.floor(math.log10(abs(r))))
    return f"{r:.{decimals}f}"


def _label(device_note: str | None, title: str) -> str:
    return f"{title}\n{device_note}" if device_note else title


_LABEL_PAD_PT = 4.0  # between a whisker's (or bar's) end and its value label


def _renderer(fig):
    get = getattr(fig.canvas, "get_renderer", None)
    return get() if get is not None else None


def _final_width_px(ax, renderer) -> float:
    """A cautious guess of the axes' width once ``tight_layout`` (``save``) has made room for the tick labels:
    the narrower of its width now and its grid cell's width less its y tick labels and the layout's pads."""
    fig = ax.figure
    now = ax.get_window_extent(renderer).width
    spec = ax.get_subplotspec() if hasattr(ax, "get_subplotspec") else None
    if spec is None:
        return 0.8 * now
    gs = spec.get_gridspec()
    cell = fig.bbox.width * len(spec.colspan) / gs.ncols
    ticks = ax.yaxis.get_tightbbox(renderer)
    pad = 2 * 1.08 * matplotlib.rcParams["font.size"] * fig.dpi / 72 + 8
    after = cell - (ticks.width if ticks is not None else 0.0) - pad
    return min(now, after) if after > 0.3 * now else 0.7 * now


def _room_for_labels(ax, labels: list, ends: list[float], signs: list[int], y0: float) -> None:
    """Widen the x data limits (an invisible point, so later artists, e.g. a ceiling's ``axvline``, still
    widen them further) until each label fits between its whisker's end and the axes' edge."""
    renderer = _renderer(ax.figure)
    fig = ax.figure
    if renderer is not None:
        widths = [t.get_window_extent(renderer).width for t in labels]
        width = _final_width_px(ax, renderer)
    else:  # no renderer to measure with: about 0.6 em per character
        widths = [0.6 * t.get_fontsize() * fig.dpi / 72 * len(t.get_text()) for t in labels]
        width = 0.6 * fig.bbox.width
    pad = _LABEL_PAD_PT * fig.dpi / 72 + 3
    fracs = [min(0.6, (w + pad) / max(width, 1.0)) for w in widths]
    tr = ax.xaxis.get_transform()
    fwd = lambda x: float(tr.transform(np.array([[x]], dtype=float))[0, 0])  # noqa: E731
    inv = tr.inverted()
    back = lambda u: float(inv.transform(np.array([[u]], dtype=float))[0, 0])  # noqa: E731
    for _ in range(6):  # a log axis's lower limit moves as the upper one grows: settle in a few rounds
        lo, hi = ax.get_xlim()
        ulo, uhi = fwd(lo), fwd(hi)
        need_hi, need_lo = uhi, ulo
        for x, s, f in zip(ends, signs, fracs):
            u = fwd(x)
            if not math.isfinite(u):
                continue
            if s > 0:
                need_hi = max(need_hi, ulo + (u - ulo) / (1 - f))
            else:
                need_lo = min(need_lo, uhi - (uhi - u) / (1 - f))
        tol = 1e-9 * max(1.0, abs(uhi), abs(ulo))
        if need_hi <= uhi + tol and need_lo >= ulo - tol:
            return
        xs = [back(need_hi)] if need_hi > uhi else []
        xs += [back(need_lo)] if need_lo < ulo else []
        ax.plot(xs, [y0] * len(xs), ls="none", marker="none", label="_room_for_labels")


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
    """Horizontal bars of ``value`` per variant, coloured by variant (:func:`palette_for`; ``palette``,
    {variant: colour}, overrides), with 20-80 percentile whiskers when ``value`` is a time. Each bar's value
    (:func:`format_value`) is written beyond the end of its whisker, and the x axis leaves room for it."""
    if df.empty:
        raise ValueError("bars(): no records to plot")
    d = df.reset_index(drop=True)
    ax = ax or plt.subplots(figsize=(7, 0.45 * len(d) + 1.4))[1]
    y = np.arange(len(d))
    pal = palette if palette is not None else palette_for(d["variant"])
    colors = [pal.get(v, variant_color(v)) for v in d["variant"]]
    vals = pd.to_numeric(d[value], errors="coerce").to_numpy(dtype=float)
    ax.barh(y, vals, color=colors)
    hi_end, lo_end = vals.copy(), vals.copy()
    if value == "median_ms" and {"p20_ms", "p80_ms"} <= set(d.columns):
        p20 = pd.to_numeric(d["p20_ms"], errors="coerce").to_numpy(dtype=float)
        p80 = pd.to_numeric(d["p80_ms"], errors="coerce").to_numpy(dtype=float)
        err = np.vstack([vals - p20, p80 - vals]).clip(min=0)
        ax.errorbar(vals, y, xerr=err, fmt="none", ecolor="black", capsize=3, lw=1)
        hi_end, lo_end = np.fmax(vals, p80), np.fmin(vals, p20)  # a NaN percentile: the bar's end
    ax.set_yticks(y, d["variant"])
    if not ax.yaxis_inverted():  # the first row on top (once: panels with a shared y axis invert it together)
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
    labels, ends, signs = [], [], []
    for yi, v, lo, hi in zip(y, vals, lo_end, hi_end):
        text = format_value(v)
        if not text or (log and v <= 0):
            continue
        s = 1 if v >= 0 else -1
        end = hi if s > 0 else lo
        labels.append(
            ax.annotate(
                text,
                (end, yi),
                xytext=(s * _LABEL_PAD_PT, 0),
                textcoords="offset points",
                ha="left" if s > 0 else "right",
                va="center",
                fontsize=9,
            )
        )
        ends.append(end)
        signs.append(s)
    if labels:
        _room_for_labels(ax, labels, ends, signs, float(y[0]))
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
    """Lines of ``y`` against ``x`` (a column, e.g. a size parsed from ``shape``) per ``hue``. A categorical
    ``hue`` (names: variants, "measured"/"predicted", ...) is coloured by :func:`palette_for`, so a line has
    the colour its name has in every other plot; a numeric one keeps seaborn's ordered colour map.
    ``palette`` ({hue value: colour}) overrides the colours."""
    if df.empty:
        raise ValueError("sweep(): no records to plot")
    ax = ax or plt.subplots(figsize=(7, 4))[1]
    if palette is None and hue in df.columns and not pd.api.types.is_numeric_dtype(df[hue]):
        palette = palette_for(df[hue].dropna())
    sns.lineplot(data=df, x=x, y=y, hue=hue, marker="o", ax=ax, palette=palette)
    if limit is not None:
        ax.axhline(limit, color="black", ls="--", lw=1)
        ax.annotate(limit_label or "measured limit", (ax.get_xlim()[0], limit), va="bottom", fontsize=9)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis)
    ax.set_title(_label(device_note, title))
    return ax


class _PlainLogFormatter(mticker.LogFormatter):
    """A log axis's tick labels as plain numbers ("0.6", "2", "100"), not "6 × 10⁻¹"."""

    def _num_to_string(self, x, vmin, vmax):
        return f"{x:g}"


def plain_log_ticks(axis) -> None:
    """Label a log ``axis`` (``ax.yaxis``, ``ax.xaxis``) in plain numbers: at the decades, and where the axis spans
    about a decade or less, at the 2, 3, 4, 6 between them too (matplotlib's default writes those "6 × 10⁰")."""
    axis.set_major_formatter(_PlainLogFormatter())
    axis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


# Two roofline points closer than this on both log axes (decades) would hide one another at a marker's size.
COINCIDENT_DECADES = 0.03


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
    Points are coloured by variant (:func:`palette_for`); one that lies on a point drawn before it (within
    ``COINCIDENT_DECADES`` on both axes) is drawn smaller on top, so that neither hides the other.
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
    pal = palette_for(p["variant"])
    drawn: list[tuple[float, float]] = []  # log10 (intensity, achieved) of the points drawn so far
    for _, r in p.iterrows():
        lx, ly = np.log10(r["intensity"]), np.log10(r["achieved"])
        # a point on one already drawn (within about a marker's radius) is drawn smaller on top, so that both show
        on_top = any(abs(lx - x) < COINCIDENT_DECADES and abs(ly - y) < COINCIDENT_DECADES for x, y in drawn)
        drawn.append((lx, ly))
        ax.scatter(
            r["intensity"], r["achieved"], s=18 if on_top else 50, zorder=4 if on_top else 3, color=pal[r["variant"]]
        )
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
