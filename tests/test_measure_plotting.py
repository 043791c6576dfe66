"""mahia.measure.plotting: a bar's value label lies beyond its whisker and inside the axes, values read as plain
numbers ("2,160"), and a variant has one colour in every plot (bars, sweep, roofline) whatever their order,
in every process, while two names of one plot never share a colour."""

import os
import subprocess
import sys

import matplotlib
import numpy as np
import pandas as pd
import pytest

from mahia.measure import plotting
from mahia.measure.hardware import Ceilings

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _timings(rows):
    return pd.DataFrame(
        [{"variant": v, "role": r, "median_ms": m, "p20_ms": lo, "p80_ms": hi} for v, r, m, lo, hi in rows]
    )


ROWS = [
    ("branch", "baseline", 2160.0, 1990.0, 2400.0),  # a wide whisker on the longest bar: its label must pass it
    ("masked", "optimized", 211.0, 200.0, 240.0),
    ("masked+plan", "peer", 14.9, 13.0, 19.5),
    ("tiny", "peer", 2.16, 2.1, np.nan),  # no p80: the label sits at the bar's end
]


def _bar_labels(ax):
    return [t for t in ax.texts if t.get_text()]


@pytest.mark.parametrize("log", [False, True])
def test_a_bar_label_lies_beyond_its_whisker_and_inside_the_axes(tmp_path, log):
    df = _timings(ROWS)
    fig, ax = plt.subplots(figsize=(5, 2.6))
    plotting.bars(df, title="labels", log=log, device_note="a GPU, a date", ax=ax)
    plotting.save(fig, "bars", tmp_path)  # tight_layout: the axes narrow, the labels must still fit
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    frame = ax.get_window_extent(r)
    labels = _bar_labels(ax)
    assert [t.get_text() for t in labels] == ["2,160", "211", "14.9", "2.16"]
    for t, (_, _, med, _, p80), yi in zip(labels, ROWS, range(len(ROWS))):
        end = med if np.isnan(p80) else max(med, p80)
        assert t.xy == pytest.approx((end, yi))  # anchored at the whisker's end, in data coordinates
        box = t.get_window_extent(r)
        whisker_px = ax.transData.transform((end, yi))[0]
        assert box.x0 >= whisker_px + 2, (t.get_text(), box.x0, whisker_px)  # beyond it, with a gap
        bar_row = ax.transData.transform((end, yi))[1]
        assert box.y0 < bar_row < box.y1  # on its bar's row
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1, (t.get_text(), box, frame)  # not clipped
    # the whisker (errorbar's line segments, none on the row without p80) ends left of the label
    segs = [s for c in ax.collections for s in c.get_segments()]
    for t in labels:
        row = round(t.xy[1])
        right = max((p[0] for s in segs for p in s if abs(p[1] - row) < 0.3 and np.isfinite(p[0])), default=-np.inf)
        assert t.get_window_extent(r).x0 > ax.transData.transform((right, row))[0]


def test_room_for_labels_survives_a_later_vertical_line_beyond_the_bars():
    df = pd.DataFrame({"variant": ["a", "b"], "role": "peer", "tflops": [306.0, 620.0]})
    ax = plotting.bars(df, value="tflops", title="ceiling")
    ax.axvline(900, color="black", ls="--")  # a ceiling drawn afterwards still widens the axis
    assert ax.get_xlim()[1] >= 900


def test_a_value_reads_as_a_plain_number():
    assert plotting.format_value(2160) == "2,160"
    assert plotting.format_value(2164.4) == "2,164"
    assert plotting.format_value(12345.6) == "12,346"
    assert plotting.format_value(211.2) == "211"
    assert plotting.format_value(14.94) == "14.9"
    assert plotting.format_value(2.164) == "2.16"
    assert plotting.format_value(0.05234) == "0.0523"
    assert plotting.format_value(99.97) == "100"
    assert plotting.format_value(float("nan")) == ""
    ax = plotting.bars(_timings(ROWS[:1]), title="one")
    assert [t.get_text() for t in _bar_labels(ax)] == ["2,160"]
    assert not any("e+" in t.get_text() for t in ax.texts)


def _bar_colors(ax, names):
    bars = [p for p in ax.patches if p.get_height() > 0][: len(names)]
    return {n: to_hex(p.get_facecolor()) for n, p in zip(names, bars)}


def _line_colors(ax):
    return {h.get_label(): to_hex(h.get_color()) for h in ax.get_legend().legend_handles}


NAMES = ["branch", "masked", "masked+plan", "torch.compile", "liger", "hybrid_parts", "a new idea"]


def _sweep_frame(names):
    return pd.DataFrame([{"T": t, "ms": t * (i + 1), "variant": n} for i, n in enumerate(names) for t in (16, 64)])


def test_a_variant_has_the_same_colour_in_bars_and_sweep_drawn_in_any_order():
    # first: bars, then a sweep whose names come in another order
    fig1, (b1, s1) = plt.subplots(1, 2)
    plotting.bars(_timings([(n, "peer", 1.0 + i, 0.9 + i, 1.1 + i) for i, n in enumerate(NAMES)]), title="b", ax=b1)
    plotting.sweep(_sweep_frame(NAMES[::-1]), x="T", y="ms", title="s", ax=s1)
    # second: the sweep first, then bars with their rows reversed and roles changed
    fig2, (s2, b2) = plt.subplots(1, 2)
    plotting.sweep(_sweep_frame(NAMES[2:] + NAMES[:2]), x="T", y="ms", title="s", ax=s2)
    rev = NAMES[::-1]
    plotting.bars(_timings([(n, "baseline", 1.0 + i, 0.9 + i, 1.1 + i) for i, n in enumerate(rev)]), title="b", ax=b2)
    seen = [_bar_colors(b1, NAMES), _line_colors(s1), _line_colors(s2), _bar_colors(b2, rev)]
    want = plotting.palette_for(NAMES)
    for colors in seen:
        assert colors == want
    assert len(set(want.values())) == len(NAMES)
    # the fixed names keep their own colour; "a new idea" hashes to the colour of "masked" and moves
    assert all(want[n] == plotting.variant_color(n) for n in NAMES[:-1])
    assert plotting.variant_color("a new idea") == want["masked"] != want["a new idea"]
    # the roofline colours its points the same way
    pts = pd.DataFrame({"variant": NAMES, "flops": 1e9, "bytes": 1e8, "median_ms": np.linspace(0.1, 1, len(NAMES))})
    ax = plotting.roofline(pts, Ceilings("x", 3000.0, 700.0, 50.0, "now"))
    got = [to_hex(c.get_facecolors()[0]) for c in ax.collections]
    assert got == [want[n] for n in NAMES]


def test_the_common_names_have_fixed_colours_and_the_rest_a_hash_stable_across_processes():
    assert plotting.variant_color("eager") == plotting.variant_color("loop") == plotting.variant_color("Manual")
    assert plotting.variant_color("grouped (optimized)") == plotting.variant_color("grouped")
    assert plotting.variant_color("mahia_triton") != plotting.variant_color("eager")
    assert plotting.variant_color("measured") != plotting.variant_color("predicted")
    names = ["a new idea", "yet another path", "flash causal 4x16x4096x128", "coef=0.1"]
    code = f"from mahia.measure import plotting; print([plotting.variant_color(n) for n in {names!r}])"
    runs = set()
    for seed in ("1", "2"):  # Python's own hash() of a str changes with PYTHONHASHSEED: the colours must not
        env = {**os.environ, "PYTHONHASHSEED": seed, "MPLBACKEND": "Agg"}
        runs.add(
            subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        )
    assert runs == {f"{[plotting.variant_color(n) for n in names]}\n"}


def test_two_names_of_one_plot_never_share_a_colour():
    # names that would share one: two fixed "before" names and two unknown names with the same hash
    by_color: dict[str, list[str]] = {}
    for i in range(200):
        by_color.setdefault(plotting.variant_color(f"path {i}"), []).append(f"path {i}")
    twins = next(v[:2] for v in by_color.values() if len(v) >= 2)
    names = ["eager", "loop", *twins, "mahia_triton"]
    pal = plotting.palette_for(names)
    assert len(set(pal.values())) == len(names)
    assert pal["eager"] == plotting.variant_color("eager")  # the first of the order keeps its own colour
    assert pal == plotting.palette_for(names[::-1])  # the order the names come in does not matter
    many = [f"variant {i}" for i in range(40)]  # more names than PALETTE holds
    assert len(set(plotting.palette_for(many).values())) == 40
    ax = plotting.bars(_timings([(n, "peer", 1.0, 0.9, 1.1) for n in names]), title="collide")
    assert len(set(_bar_colors(ax, names).values())) == len(names)
    s = plotting.sweep(_sweep_frame(names), x="T", y="ms", title="collide")
    assert len(set(_line_colors(s).values())) == len(names)


def test_a_numeric_hue_keeps_the_ordered_colour_map_and_an_explicit_palette_wins():
    df = pd.DataFrame({"step": [0, 1] * 3, "cv": range(6), "coef": [0.0] * 2 + [0.01] * 2 + [0.1] * 2})
    ax = plotting.sweep(df, x="step", y="cv", hue="coef", logx=False, title="numeric")
    assert len(ax.get_lines()) >= 3
    ax = plotting.sweep(
        _sweep_frame(["eager", "sdpa"]), x="T", y="ms", title="mine", palette={"eager": "#123456", "sdpa": "#654321"}
    )
    assert _line_colors(ax) == {"eager": "#123456", "sdpa": "#654321"}


def test_sweep_labels_a_short_log_axis_in_plain_numbers():
    """09's fabric sweep (H100, b34185d) labelled its log-y ticks '6 × 10⁰, 4 × 10⁰, ... 6 × 10⁻¹' for 0.3–7 ms."""
    df = pd.DataFrame({"T": [1, 2, 4], "ms": [0.3, 2.0, 7.0], "variant": ["a"] * 3})
    ax = plotting.sweep(df, x="T", y="ms", title="short", logy=True)
    ax.figure.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() + ax.yaxis.get_minorticklabels() if t.get_text()]
    assert "1" in labels and "0.6" in labels and "6" in labels
    assert not [s for s in labels if "10^" in s or "×" in s or "e-" in s or "e−" in s]
    wide = pd.DataFrame({"T": [1, 2, 4], "ms": [0.01, 1.0, 1000.0], "variant": ["a"] * 3})
    ax = plotting.sweep(wide, x="T", y="ms", title="wide", logy=True)
    ax.figure.canvas.draw()
    assert [t.get_text() for t in ax.yaxis.get_minorticklabels() if t.get_text()] == []  # decades only
    assert "0.01" in [t.get_text() for t in ax.get_yticklabels()]
    plt.close("all")


def test_a_roofline_point_on_another_is_drawn_smaller_on_top():
    # 00-10: on the H100, x*y+z (0.25 FLOP/byte, 0.74 TFLOP/s) hid under exp bfloat16 (0.25, 0.72)
    m = 2**26
    pts = pd.DataFrame(
        {
            "variant": ["x*y+z", "exp bfloat16", "matmul 4096"],
            "flops": [2 * m, m, 2 * 4096**3],
            "bytes": [8 * m, 4 * m, 3 * 4096**2 * 2],
            "median_ms": [0.1806, 0.0936, 0.192],
        }
    )
    ax = plotting.roofline(pts, Ceilings("x", 3000.0, 700.0, 50.0, "now"))
    assert [float(c.get_sizes()[0]) for c in ax.collections] == [50.0, 18.0, 50.0]
    assert ax.collections[1].get_zorder() > ax.collections[0].get_zorder()


def test_a_qualified_variant_keeps_the_colour_of_the_variant_it_qualifies():
    # notebook 02 names its attention rows "<backend> causal" / "<backend> full": each backend keeps one colour
    # in every figure (the roofline and the training bars colour by these names, the backends figure by backend)
    for backend in ("flash", "cudnn", "efficient", "math"):
        assert plotting.variant_color(f"{backend} causal") == plotting.variant_color(backend)
        assert plotting.variant_color(f"{backend} full") == plotting.variant_color(backend)
    pal = plotting.palette_for(["manual causal", "cudnn causal", "flash causal", "efficient causal", "math causal"])
    assert pal["cudnn causal"] == plotting.variant_color("cudnn") != pal["flash causal"]
    assert len(set(pal.values())) == len(pal)
    # in one plot with both, the fixed name keeps its colour and the qualified one moves
    pal = plotting.palette_for(["flash", "flash causal"])
    assert pal["flash"] == plotting.variant_color("flash") != pal["flash causal"]
