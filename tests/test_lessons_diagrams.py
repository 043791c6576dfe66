"""mahia.lessons.diagrams: each draw, with its notebook's arguments, has clean texts (no None, nan or braces), inside
the figure and apart after saving's tight layout; the checkpoint timeline's memory follows each policy."""

import math
import re
import warnings

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from mahia.lessons.diagrams import checkpoint, fusion, memory  # noqa: E402


def texts(fig) -> list[Text]:
    """The visible, non-empty texts of ``fig``, without the tick and axis labels of axes drawn without axes."""
    off = {id(t) for ax in fig.axes if not ax.axison for axis in (ax.xaxis, ax.yaxis) for t in axis.findobj(Text)}
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in off]


def layout_problems(fig) -> list[str]:
    """After saving's tight layout: labels whose rendered boxes intersect, and labels outside the figure."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Axes that are not compatible with tight_layout"
        fig.tight_layout()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in texts(fig)]
    frame, found = fig.bbox, []
    for i, (a, ba) in enumerate(boxes):
        if ba.x0 < frame.x0 - 1 or ba.x1 > frame.x1 + 1 or ba.y0 < frame.y0 - 1 or ba.y1 > frame.y1 + 1:
            found.append(f"outside the figure: {a!r}")
        found += [f"overlap: {a!r} and {b!r}" for b, bb in boxes[i + 1 :] if ba.overlaps(bb)]
    return found


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_layout_check_finds_overlapping_and_outside_labels():
    fig = plt.figure(figsize=(3, 2))
    fig.text(0.5, 0.5, "one label")
    fig.text(0.52, 0.5, "another label")
    fig.text(0.99, 0.5, "past the right edge")
    found = layout_problems(fig)
    assert "overlap: 'one label' and 'another label'" in found
    assert "outside the figure: 'past the right edge'" in found


RMS_OPS = ["aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.add.Tensor", "aten.rsqrt.default", "aten.mul.Tensor"]
DRAWN = {  # the notebooks' calls, and the extremes their arguments can take
    "memory (00), CPU": lambda: memory.draw(),
    "memory (00), GPU": lambda: memory.draw(copy_gbps=4250.0, peak_tflops=686.0, l2_mib=60, peak_name="matmul_bf16"),
    "fusion (03)": lambda: fusion.draw(RMS_OPS + ["aten.mul.Tensor"], name="RMSNorm", inputs="x, w", output="y"),
    "fusion, 16 ops": lambda: fusion.draw([f"aten._to_copy.op{i}" for i in range(16)]),
    "checkpoint (07)": lambda: checkpoint.draw(n_blocks=6, input_share=0.02, selective_share=0.98),
    "checkpoint, 2 blocks": lambda: checkpoint.draw(n_blocks=2, input_share=0.98, selective_share=0.02),
}


@pytest.mark.parametrize("name", DRAWN)
def test_diagram_texts_are_clean_inside_and_apart(name):
    fig = DRAWN[name]()
    assert isinstance(fig, Figure)
    words = [t.get_text() for t in texts(fig)]
    assert words and not [w for w in words if re.search(r"\bNone\b|\bnan\b|\{|\}", w)]
    assert layout_problems(fig) == []


def test_checkpoint_timeline_peaks_follow_the_policy():
    n, c, s = 4, 0.15, 0.6
    peak = {p: max(r["memory"] for r in checkpoint.timeline(p, n, input_share=c, selective_share=s))
            for p in checkpoint.POLICIES}  # fmt: skip
    assert math.isclose(peak["none"], n)  # every block's activations at the loss
    assert math.isclose(peak["full"], n * c + 1)  # every input, and one block rebuilt
    assert math.isclose(peak["selective"], (n - 1) * s + 1)
    for p in checkpoint.POLICIES:  # everything kept is freed by the end of backward
        assert math.isclose(checkpoint.timeline(p, n)[-1]["memory"], 0.0, abs_tol=1e-12)
    assert [r["label"] for r in checkpoint.timeline("full", 2)] == ["F1", "F2", "loss", "R2", "B2", "R1", "B1"]
