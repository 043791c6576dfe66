"""mahia.lessons.plot_labels: clustered labels are moved apart (none overlaps, none leaves the axes), lone ones
stay on their point, and the overlap check itself finds overlapping texts."""

import matplotlib
import pandas as pd
import pytest

from mahia.lessons.plot_labels import drawn_texts, overlapping_texts, spread_labels
from mahia.measure import plotting
from mahia.measure.hardware import Ceilings

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _axes(points):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.set(xscale="log", yscale="log", xlim=(0.5, 2000), ylim=(0.5, 500))
    for text, (x, y) in points.items():
        ax.scatter([x], [y], s=50)
        ax.annotate(f"  {text}", (x, y), fontsize=8)
    return fig, ax


def _label_boxes(ax):
    from matplotlib.text import Text

    r = ax.figure.canvas.get_renderer()
    return {a.get_text(): Text.get_window_extent(a, r) for a in ax.texts}


def test_clustered_labels_no_longer_overlap_stay_inside_and_point_back(tmp_path):
    cluster = {f"kernel {i}": (1.0 + 0.02 * i, 100.0 + i) for i in range(6)}
    fig, ax = _axes({**cluster, "far": (1000.0, 1.0)})
    assert overlapping_texts(fig)  # the check sees the cluster before
    anns = spread_labels(ax)
    assert len(anns) == len(ax.texts) == 7
    assert overlapping_texts(fig) == []
    frame = ax.get_window_extent(fig.canvas.get_renderer())
    for box in _label_boxes(ax).values():
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
    by_text = {a.get_text(): a for a in ax.texts}
    assert by_text["far"].arrow_patch is None  # a lone label stays on its point's line
    assert by_text["far"].xyann[1] == 0
    assert sum(a.arrow_patch is not None for a in anns) >= 4  # moved ones are joined to their point
    assert all(not a.get_in_layout() for a in anns)  # saving (tight_layout) cannot move the points under them
    plotting.save(fig, "labels", tmp_path)
    assert overlapping_texts(fig) == []


def test_a_label_at_the_right_edge_goes_left_and_the_legend_is_avoided():
    fig, ax = _axes({"a long label at the edge": (1900.0, 10.0), "by the legend": (400.0, 0.6)})
    ax.plot([1, 2], [1, 2], label="a legend entry that is wide")
    ax.legend(loc="lower right")
    spread_labels(ax)
    boxes = _label_boxes(ax)
    r = fig.canvas.get_renderer()
    assert boxes["a long label at the edge"].x1 <= ax.get_window_extent(r).x1
    legend = ax.get_legend().get_window_extent(r)
    assert not boxes["by the legend"].overlaps(legend)
    assert overlapping_texts(fig) == []


def test_the_roofline_of_clustered_kernels():
    c = Ceilings("x", 4250.0, 686.0, 50.0, "now")
    rows = [("rms mahia", 1.0, 4.2), ("rms f+b mahia", 1.3, 4.3), ("swiglu mahia", 0.83, 3.5)]
    rows += [("swiglu f+b mahia", 1.0, 3.6), ("rope f+b mahia", 0.75, 2.7), ("rms eager", 1.0, 0.3)]
    rows += [("rms f+b eager", 1.3, 0.3), ("swiglu eager", 0.83, 0.42), ("rope f+b eager", 0.75, 0.18)]
    pts = pd.DataFrame(rows, columns=["variant", "intensity", "tf"]).assign(bytes=1e9)
    pts["flops"] = pts["intensity"] * 1e9
    pts["median_ms"] = pts["flops"] / (pts["tf"] * 1e12) * 1e3
    ax = plotting.roofline(pts, c, device_note="a GPU, a date", title="clustered")
    assert overlapping_texts(ax.figure)
    spread_labels(ax)
    assert overlapping_texts(ax.figure) == []


def test_no_labels_is_fine():
    fig, ax = _axes({})
    assert spread_labels(ax) == []


def test_drawn_texts_leave_out_ticks_outside_the_view():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    ax.set_title("a title")
    texts = [t.get_text() for t in drawn_texts(fig)]
    assert "a title" in texts
    assert "1.0" in texts
    ax.set(xlim=(0.2, 0.4), ylim=(0.2, 0.4))
    shown = [t.get_text() for t in drawn_texts(fig)]
    assert "1.0" not in shown and "0.300" in shown  # ticks outside the view are not drawn
    assert overlapping_texts(fig) == []
    ax.annotate("collides", (0.3, 0.5))
    ax.annotate("collides too", (0.3, 0.5))
    assert overlapping_texts(fig) == [("collides", "collides too")]


def test_a_sweep_palette_keeps_each_line_in_its_colour_in_every_panel():
    from matplotlib.colors import to_hex

    palette = {"sdpa": "#55a868", "manual": "#c44e52", "chunked": "#4c72b0"}
    full = pd.DataFrame({"T": [1, 2] * 3, "ms": range(6), "variant": ["sdpa"] * 2 + ["manual"] * 2 + ["chunked"] * 2})
    fig, (a1, a2) = plt.subplots(1, 2)
    plotting.sweep(full, x="T", y="ms", title="all", ax=a1, palette=palette)
    plotting.sweep(full[full["variant"] != "sdpa"], x="T", y="ms", title="two", ax=a2, palette=palette)
    for ax in (a1, a2):
        by_label = {h.get_label(): to_hex(h.get_color()) for h in ax.get_legend().legend_handles}
        assert by_label == {k: v for k, v in palette.items() if k in by_label} and len(by_label) >= 2


def test_leader_lines_do_not_cross_on_the_h100_roofline():
    # 00-10: the H100's matmul sweep (b34185d): the leaders of matmul 4096 and 8192 crossed
    def side(a, b, p):
        return (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0])

    def _segments_cross(p1, p2, q1, q2):
        return side(q1, q2, p1) * side(q1, q2, p2) < 0 and side(p1, p2, q1) * side(p1, p2, q2) < 0

    c = Ceilings("x", 3021.0, 693.6, 51.4, "now")
    times = {256: 0.005984, 512: 0.006592, 1024: 0.010304, 2048: 0.028032, 4096: 0.19232, 8192: 1.601888}
    rows = [(f"matmul {n}", 2 * n**3, 6 * n * n, ms) for n, ms in times.items()]
    rows.append(("x*y+z", 2 * 2**26, 8 * 2**26, 0.180608))
    pts = pd.DataFrame(rows, columns=["variant", "flops", "bytes", "median_ms"])
    ax = plotting.roofline(pts, c, device_note="H100", title="Roofline (bfloat16)")
    anns = spread_labels(ax)
    fig = ax.figure
    r = fig.canvas.get_renderer()
    lines = []
    for a in anns:
        if a.arrow_patch is None:
            continue
        box = a.get_window_extent(r)
        lines.append((tuple(ax.transData.transform(a.xy)), ((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2)))
    assert len(lines) >= 2
    crossing = [
        (i, j) for i in range(len(lines)) for j in range(i + 1, len(lines)) if _segments_cross(*lines[i], *lines[j])
    ]
    assert crossing == []
    assert overlapping_texts(fig) == []
    assert _segments_cross((0, 0), (2, 2), (0, 2), (2, 0)) and not _segments_cross((0, 0), (1, 1), (2, 2), (3, 3))
