"""mahia.lessons.diagrams: each draw returns a Figure with its labelled parts, clean text (no None, nan or
unfilled braces), every text inside the figure and no two text boxes overlapping, as the Agg renderer draws
them, before and after the tight layout that saving applies."""

import math
import re
import warnings

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from mahia.lessons.diagrams import checkpoint, flash, fusion, graphs, memory, moe, queues, scan  # noqa: E402


def drawn(fig) -> list[Text]:
    """The visible, non-empty texts of ``fig``, without the tick and axis labels of axes drawn without axes."""
    off = {id(t) for ax in fig.axes if not ax.axison for axis in (ax.xaxis, ax.yaxis) for t in axis.findobj(Text)}
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in off]


def texts(fig) -> list[str]:
    return [t.get_text() for t in drawn(fig)]


def layout_problems(fig) -> list[str]:
    """Pairs of visible labels whose rendered boxes intersect, and labels reaching outside the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in drawn(fig)]  # an annotation without arrow
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


def _check_clean(fig) -> list[str]:
    """The texts of ``fig``, after checking that it is a Figure whose texts are clean, inside it, and apart."""
    assert isinstance(fig, Figure)
    words = texts(fig)
    assert words
    for t in words:
        assert not re.search(r"\bNone\b|\bnan\b|\{|\}", t), t
    assert layout_problems(fig) == []
    return words


def _has(words: list[str], *parts: str) -> None:
    joined = "\n".join(words)
    missing = [p for p in parts if p not in joined]
    assert not missing, f"missing {missing} in {words}"


# --- memory (00) ---------------------------------------------------------------------------------------


def test_memory_schematic_has_every_level_and_the_roofline_parts():
    texts = _check_clean(memory.draw())
    _has(texts, "registers · shared memory", "L2 cache", "device memory (HBM)", "host memory (CPU)")
    _has(texts, "memory-bound", "compute-bound", "roof: peak FLOP/s", "ridge point", "slope: bandwidth")
    assert not any("GB/s" in t or "MiB" in t or "FLOP/byte here" in t for t in texts)  # nothing typed in


def test_memory_writes_the_measured_numbers_it_is_given():
    texts = _check_clean(memory.draw(copy_gbps=4250.0, peak_tflops=686.0, l2_mib=60, peak_name="matmul_bf16"))
    _has(texts, "measured copy: 4,250 GB/s", "60 MiB on this GPU", "= 161 FLOP/byte here (matmul_bf16)")
    only_copy = _check_clean(memory.draw(copy_gbps=20.5))
    _has(only_copy, "measured copy: 20 GB/s")
    assert not any("FLOP/byte here" in t for t in only_copy)  # the ridge needs both ceilings


# --- queues (01) ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [{}, {"kernels": 8, "sync_after": 5, "kernel": 0.6}, {"kernels": 3, "sync_after": 1}])
def test_queues_draw_both_lanes_the_wait_and_the_idle_device(kw):
    texts = _check_clean(queues.draw(**kw))
    n = kw.get("kernels", 6)
    _has(texts, "host\n(Python)", "device\n(GPU)", "host waits", "copy", "device idle", "time lost to the sync")
    assert sum(t == f"K{n}" for t in texts) == 2 and sum(t == f"L{n}" for t in texts) == 2  # both panels
    assert any(f"after launch {kw.get('sync_after', 3)}" in t for t in texts)


def test_queue_timeline_drains_then_waits_for_the_host():
    free = queues.timeline(4, None, 1.0, 2.0, 0.5)
    assert free["runs"][0] == (1.0, 3.0) and free["runs"][-1] == (7.0, 9.0)  # back to back, after the first launch
    synced = queues.timeline(4, 2, 1.0, 2.0, 0.5)
    assert synced["wait"] == (2.0, 5.5)  # from the 2nd launch until kernel 2 ends (5.0) and the copy (0.5)
    assert synced["idle"] == (5.5, 6.5)  # the device waits for the 3rd launch
    assert synced["runs"][2][0] == 6.5 and synced["end"] > free["end"]


# --- flash (02) ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("blocks, causal, row", [(4, True, None), (2, True, 1), (6, False, 5), (8, True, 0)])
def test_flash_tiling_labels_every_block_and_the_notes(blocks, causal, row):
    texts = _check_clean(flash.draw(blocks=blocks, causal=causal, row=row))
    for i in range(blocks):
        _has(texts, f"Q{i}", f"K{i}ᵀ", f"V{i}", f"O{i}")
    _has(texts, "one program per query block", "online softmax", "running max m and sum ℓ", "T×S score matrix")
    assert any("grey tiles" in t for t in texts) == causal
    r = min(2, blocks - 1) if row is None else row
    assert any(f"program of Q{r}" in t for t in texts)


# --- fusion (03) ---------------------------------------------------------------------------------------


def test_fusion_of_a_traced_chain_shortens_aten_names():
    ops = ["aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.add.Tensor", "aten.rsqrt.default", "aten.mul.Tensor"]
    texts = _check_clean(fusion.draw(ops + ["aten.mul.Tensor"], name="RMSNorm", inputs="x, w"))
    _has(texts, "eager RMSNorm: 6 kernels, one per op", "fused RMSNorm: one kernel", "registers", "device memory")
    _has(texts, "read x, w once", "write y once")
    assert sum(t == "mul" for t in texts) == 4 and sum(t == "pow" for t in texts) == 2  # each row names every op
    assert fusion.short_op("aten._to_copy.default") == "_to_copy" and fusion.short_op("my_op") == "my_op"


@pytest.mark.parametrize("k", [2, 9, 16])
def test_fusion_stays_readable_from_two_to_sixteen_ops(k):
    texts = _check_clean(fusion.draw([f"aten._to_copy.op{i}" for i in range(k)]))
    _has(texts, f"eager: {k} kernels, one per op", "fused: one kernel")


# --- graphs (05), checkpoint (07), moe (08), scan (09) -------------------------------------------------


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


def test_moe_permutation_is_a_stable_sort_by_expert():
    rows, offs = moe.permutation([(0, 2), (1, 0), (0, 1)], 3)
    assert rows == [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (0, 2)]
    assert offs == [3, 5, 6]
    rows, offs = moe.permutation([(1,), (1,)], 3)  # an empty expert keeps its offset
    assert offs == [0, 2, 2]


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


def test_checkpoint_diagram_names_the_recomputes_and_ramps_the_memory():
    """07's H100 figure (b34185d): the selective row's small recompute boxes had no label, though its title cites
    "(r)", and the kept memory jumped at the end of each recompute instead of growing while it runs."""
    fig = checkpoint.draw(n_blocks=3)
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"r1", "r2", "r3", "R1"} <= texts
    lines = [ln for ax in fig.axes for ln in ax.get_lines()]
    assert lines and all(ln.get_drawstyle() == "default" for ln in lines)
    plt.close(fig)
