"""mahia.lessons.plot_labels.spread_labels: clustered labels are moved apart, lone ones stay."""

import math

import matplotlib

from mahia.lessons.plot_labels import spread_labels

matplotlib.use("Agg")


def _axes(points):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set(xscale="log", yscale="log")
    for text, (x, y) in points.items():
        ax.scatter([x], [y])
        ax.annotate(f"  {text}", (x, y))
    return fig, ax


def test_clustered_labels_no_longer_overlap_and_point_back():
    fig, ax = _axes({"a": (1.0, 100.0), "b": (1.1, 101.0), "c": (1.05, 99.0), "far": (1000.0, 1.0)})
    placed = spread_labels(ax, gap=0.075)
    assert len(ax.texts) == 4
    for i, (x1, y1) in enumerate(placed):
        for x2, y2 in placed[i + 1 :]:
            assert not (abs(x1 - x2) < 0.35 and abs(y1 - y2) < 0.075)
    by_text = {a.get_text(): a for a in ax.texts}
    assert by_text["b"].arrow_patch is None  # the highest stays where it was
    assert by_text["a"].arrow_patch is not None and by_text["c"].arrow_patch is not None  # moved: joined
    assert by_text["far"].arrow_patch is None
    assert math.isclose(by_text["far"].xyann[1], 1.0)
    matplotlib.pyplot.close(fig)


def test_no_labels_is_fine():
    fig, ax = _axes({})
    assert spread_labels(ax) == []
    matplotlib.pyplot.close(fig)
