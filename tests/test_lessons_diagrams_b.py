"""The diagrams of notebooks 05-09 (mahia.lessons.diagrams: graphs, checkpoint, moe, scan): each returns a
Figure with the parts it teaches labelled, and no two labels overlap or leave the figure (text
bounding boxes from the Agg renderer), as drawn and as saved (``ctx.save`` applies a tight layout)."""

import math
import warnings

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from mahia.lessons.diagrams import checkpoint, graphs, moe, scan  # noqa: E402


def texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def layout_problems(fig) -> list[str]:
    """Pairs of visible labels whose rendered boxes intersect, and labels reaching outside the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [
        (t.get_text(), t.get_window_extent(renderer))
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip()
    ]
    frame = fig.bbox
    found = []
    for i, (a, ba) in enumerate(boxes):
        if ba.x0 < frame.x0 - 1 or ba.x1 > frame.x1 + 1 or ba.y0 < frame.y0 - 1 or ba.y1 > frame.y1 + 1:
            found.append(f"outside the figure: {a!r}")
        found += [f"overlap: {a!r} and {b!r}" for b, bb in boxes[i + 1 :] if ba.overlaps(bb)]
    return found


def saved_layout_problems(fig) -> list[str]:
    """:func:`layout_problems` after the tight layout that saving applies; a figure it cannot lay out fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Axes that are not compatible with tight_layout"
        fig.tight_layout()
    return layout_problems(fig)


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


@pytest.mark.parametrize("n", [2, 4, 6])
def test_graphs_capture_and_replay(n):
    fig = graphs.draw(n_kernels=n)
    assert isinstance(fig, Figure)
    words = texts(fig)
    for part in ("host", "device", "memory", "g.replay()", "static_in.copy_(x)"):
        assert part in words
    assert any(w.startswith("Capture") for w in words) and any(w.startswith("Replay") for w in words)
    assert any("torch.cuda.graph(g)" in w for w in words) and any("memory pool" in w for w in words)
    # review 05-5: static_in is cloned before the capture (notebook 05's Graphed), so it is not drawn inside the pool
    assert not any("memory pool" in w and "static_in" in w for w in words)
    assert any(w.startswith("static_in") and "before capture" in w for w in words)
    assert sum(w == f"launch k{i + 1}" for w in words for i in range(n)) == n  # one launch per kernel, eager
    assert sum(w == "k1" for w in words) == 2  # eager and replayed
    assert layout_problems(fig) == []
    assert saved_layout_problems(fig) == []


def test_graphs_refuses_sizes_that_do_not_fit():
    with pytest.raises(ValueError, match="n_kernels"):
        graphs.draw(n_kernels=1)
    with pytest.raises(ValueError, match="at most 6"):
        graphs.draw(n_kernels=7)


def test_checkpoint_timeline_peaks_follow_the_policy():
    n, c, s = 4, 0.15, 0.6
    peak = {
        p: max(r["memory"] for r in checkpoint.timeline(p, n, input_share=c, selective_share=s))
        for p in checkpoint.POLICIES
    }
    assert math.isclose(peak["none"], n)  # every block's activations at the loss
    assert math.isclose(peak["full"], n * c + 1)  # every input, and one block rebuilt
    assert math.isclose(peak["selective"], (n - 1) * s + 1)
    for p in checkpoint.POLICIES:  # everything kept is freed by the end of backward
        assert math.isclose(checkpoint.timeline(p, n)[-1]["memory"], 0.0, abs_tol=1e-12)
    full = [r["label"] for r in checkpoint.timeline("full", 2)]
    assert full == ["F1", "F2", "loss", "R2", "B2", "R1", "B1"]


def test_checkpoint_draw_labels_every_policy_and_its_peak():
    fig = checkpoint.draw(n_blocks=4)
    assert isinstance(fig, Figure)
    words = texts(fig)
    for label in ("F1", "F4", "B1", "R1", "loss", "forward", "backward", "recompute", "activations kept for backward"):
        assert label in words
    assert sum(w.startswith("peak:") for w in words) == 3
    assert any(w.startswith("no checkpointing") for w in words) and any(w.startswith("selective") for w in words)
    assert layout_problems(fig) == []
    assert saved_layout_problems(fig) == []
    with pytest.raises(ValueError, match="policies"):
        checkpoint.draw(policies=("none", "offload"))
    with pytest.raises(ValueError, match="input_share"):
        checkpoint.timeline("full", 4, input_share=1.5)


def test_moe_permutation_is_a_stable_sort_by_expert():
    rows, offs = moe.permutation([(0, 2), (1, 0), (0, 1)], 3)
    assert rows == [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (0, 2)]
    assert offs == [3, 5, 6]
    rows, offs = moe.permutation([(1,), (1,)], 3)  # an empty expert keeps its offset
    assert offs == [0, 2, 2]
    with pytest.raises(ValueError, match="expert ids"):
        moe.permutation([(0, 3)], 3)


def test_moe_draw_shows_permute_two_grouped_gemms_swiglu_and_combine():
    fig = moe.draw()
    assert isinstance(fig, Figure)
    words = texts(fig)
    n_rows = sum(len(a) for a in moe.DEFAULT_ASSIGNMENTS)
    for part in ("permute", "grouped\nGEMM 1", "SwiGLU", "grouped\nGEMM 2", "combine", "tokens"):
        assert any(w.startswith(part) for w in words), part
    assert sum(w.startswith("rows @ W13[") for w in words) == 3  # one block per expert in each grouped GEMM
    assert sum(w.startswith("rows @ W2[") for w in words) == 3
    assert sum(w.startswith("offs[") for w in words) == 3
    assert sum(w.startswith("o") and "," in w for w in words) == n_rows  # one expert output per row
    assert sum(w.startswith("y") and "Σ" in w for w in words) == len(moe.DEFAULT_ASSIGNMENTS)
    assert layout_problems(fig) == []
    assert saved_layout_problems(fig) == []
    with pytest.raises(ValueError, match="same number"):
        moe.draw([(0, 1), (1,)])


@pytest.mark.parametrize("n_chunks, chunk", [(4, 4), (3, 8), (6, 4)])
def test_scan_draw_shows_the_loop_the_chunks_and_the_states(n_chunks, chunk):
    fig = scan.draw(n_chunks=n_chunks, chunk=chunk)
    assert isinstance(fig, Figure)
    words = texts(fig)
    T = n_chunks * chunk
    assert str(T) in words and "1" in words  # every loop step drawn
    assert sum(w.startswith("chunk ") for w in words) == n_chunks
    assert [w for w in words if w.startswith("S") and w[1:].isdigit()] == [f"S{c}" for c in range(n_chunks + 1)]
    assert any(w.startswith("inside a chunk") for w in words) and any(w.startswith("between chunks") for w in words)
    assert layout_problems(fig) == []
    assert saved_layout_problems(fig) == []


def test_scan_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="at most 24"):
        scan.draw(n_chunks=5, chunk=8)


def test_checkpoint_diagram_names_the_recomputes_and_ramps_the_memory():
    """07's H100 figure (b34185d): the selective row's small recompute boxes had no label, though its title cites
    "(r)", and the kept memory jumped at the end of each recompute instead of growing while it runs."""
    fig = checkpoint.draw(n_blocks=3)
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"r1", "r2", "r3", "R1"} <= texts
    lines = [ln for ax in fig.axes for ln in ax.get_lines()]
    assert lines and all(ln.get_drawstyle() == "default" for ln in lines)
    plt.close(fig)
