"""mahia.lessons.diagrams (notebooks 00-03): each draw returns a Figure with its labelled parts, clean text
(no None, nan or unfilled braces), every text inside the figure and no two text boxes overlapping, as the
Agg renderer draws them; and each refuses arguments it cannot draw."""

import re

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from mahia.lessons.diagrams import flash, fusion, memory, queues  # noqa: E402
from mahia.lessons.plot_labels import drawn_texts, overlapping_texts, text_box  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _texts(fig) -> list[str]:
    return [t.get_text() for t in drawn_texts(fig)]


def _check_clean(fig) -> list[str]:
    """The texts of ``fig``, after checking that it is a Figure whose texts are clean, inside it, and apart."""
    assert isinstance(fig, Figure)
    texts = _texts(fig)
    assert texts
    for t in texts:
        assert not re.search(r"\bNone\b|\bnan\b|\{|\}", t), t
    r = fig.canvas.get_renderer()
    page = fig.bbox
    for t in drawn_texts(fig):
        box = text_box(t, r)
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1 and page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, (
            t.get_text()
        )
    assert overlapping_texts(fig) == []
    return texts


def _has(texts: list[str], *parts: str) -> None:
    joined = "\n".join(texts)
    missing = [p for p in parts if p not in joined]
    assert not missing, f"missing {missing} in {texts}"


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


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "4250", True])
def test_memory_refuses_a_number_that_is_not_positive(bad):
    with pytest.raises(ValueError, match="copy_gbps must be a positive number"):
        memory.draw(copy_gbps=bad)


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


@pytest.mark.parametrize(
    "kw, what",
    [
        ({"kernels": 1}, "kernels"),
        ({"sync_after": 6}, "sync_after"),
        ({"sync_after": 0}, "sync_after"),
        ({"launch": 0}, "launch"),
        ({"copy": -1.0}, "copy"),
    ],
)
def test_queues_refuse_a_schedule_they_cannot_draw(kw, what):
    with pytest.raises(ValueError, match=what):
        queues.draw(**kw)


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


@pytest.mark.parametrize("kw", [{"blocks": 1}, {"blocks": 9}, {"row": 4}, {"blocks": 3, "row": -1}])
def test_flash_refuses_a_grid_it_cannot_draw(kw):
    with pytest.raises(ValueError):
        flash.draw(**kw)


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


@pytest.mark.parametrize("bad", [[], ["one"], "pow", [f"op{i}" for i in range(17)]])
def test_fusion_refuses_a_chain_it_cannot_draw(bad):
    with pytest.raises(ValueError, match="ops must be a sequence"):
        fusion.draw(bad)
