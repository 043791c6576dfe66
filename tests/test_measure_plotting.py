"""mahia.measure.plotting: a bar's value lies beyond its whisker and inside the axes; a variant has one colour in every
plot and process, and two names of one plot never share one."""

import os
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from mahia.measure import plotting
from mahia.measure.hardware import Ceilings

ROWS = [  # variant, median, p20, p80: a wide whisker on the longest bar, no p80 on the last
    ("branch", 2160.0, 1990.0, 2400.0),
    ("masked", 211.0, 200.0, 240.0),
    ("masked+plan", 67.0, 60.0, 70.0),
    ("tiny", 2.16, 2.1, np.nan),
]
CEIL = Ceilings("x", 3000.0, 700.0, 50.0, "now")


def _timings(rows):
    return pd.DataFrame(
        [{"variant": v, "role": "peer", "median_ms": m, "p20_ms": lo, "p80_ms": hi} for v, m, lo, hi in rows]
    )


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


@pytest.mark.parametrize("log", [False, True])
def test_a_bar_label_lies_beyond_its_whisker_and_inside_the_axes(tmp_path, log):
    fig, ax = plt.subplots(figsize=(5, 2.6))
    plotting.bars(_timings(ROWS), title="labels", log=log, device_note="a GPU, a date", ax=ax)
    plotting.save(fig, "bars", tmp_path)  # tight_layout narrows the axes: the labels must still fit
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    frame, labels = ax.get_window_extent(r), [t for t in ax.texts if t.get_text()]
    assert [t.get_text() for t in labels] == ["2,160", "211", "67.0", "2.16"]  # three significant digits
    for t, (_, med, _, p80), yi in zip(labels, ROWS, range(len(ROWS))):
        end = med if np.isnan(p80) else p80
        box = t.get_window_extent(r)
        assert box.x0 >= ax.transData.transform((end, yi))[0] + 2 and box.x1 <= frame.x1, t.get_text()
    ax = plotting.bars(pd.DataFrame({"variant": ["a", "b"], "tflops": [306.0, 620.0]}), value="tflops", title="c")
    ax.axvline(900)  # a ceiling drawn afterwards still widens the axis
    assert ax.get_xlim()[1] >= 900


def _line_colors(ax):
    return {h.get_label(): to_hex(h.get_color()) for h in ax.get_legend().legend_handles}


def _sweep_frame(names):
    return pd.DataFrame([{"T": t, "ms": t * (i + 1), "variant": n} for i, n in enumerate(names) for t in (16, 64)])


def test_a_variant_has_one_colour_in_every_plot_and_process_and_none_shared_in_a_plot():
    names = ["branch", "masked", "masked+plan", "torch.compile", "liger", "flash", "flash causal", "a new idea"]
    want = plotting.palette_for(names)
    assert want == plotting.palette_for(names[::-1]) and len(set(want.values())) == len(names)
    ax = plotting.bars(_timings([(n, 1.0 + i, 0.9 + i, 1.1 + i) for i, n in enumerate(names[::-1])]), title="b")
    assert [to_hex(p.get_facecolor()) for p in ax.patches[: len(names)]] == [want[n] for n in names[::-1]]
    assert _line_colors(plotting.sweep(_sweep_frame(names[3:] + names[:3]), x="T", y="ms", title="s")) == want
    pts = pd.DataFrame({"variant": names, "flops": 1e9, "bytes": 1e8, "median_ms": np.linspace(0.1, 1, len(names))})
    assert [to_hex(c.get_facecolors()[0]) for c in plotting.roofline(pts, CEIL).collections] == [want[n] for n in names]
    # a qualified name keeps its family's colour where the family is not in the plot
    qualified = plotting.palette_for(["flash causal", "math causal"])
    assert qualified["flash causal"] == plotting.palette_for(["flash"])["flash"]
    assert len(set(plotting.palette_for([f"variant {i}" for i in range(40)]).values())) == 40
    code = f"from mahia.measure import plotting; print(plotting.palette_for({names!r}))"
    env = {**os.environ, "PYTHONHASHSEED": "7", "MPLBACKEND": "Agg"}  # Python's str hash() changes with it
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out == f"{want}\n"
    mine = {"eager": "#123456", "sdpa": "#654321"}
    assert _line_colors(plotting.sweep(_sweep_frame(list(mine)), x="T", y="ms", title="m", palette=mine)) == mine
