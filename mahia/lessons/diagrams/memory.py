"""The memory hierarchy of a GPU and the roofline it implies (notebook 00). Left: where bytes live, fastest
and smallest at the top. Right: a kernel with few FLOPs per byte is limited by the bandwidth (the slope), one
with many by the arithmetic units (the roof); they meet at the ridge point, peak / bandwidth. The axes are
schematic; measured numbers appear only when given: ``draw(copy_gbps=4250, peak_tflops=686, l2_mib=60)``."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Polygon

__all__ = ["draw"]

LEVELS = (
    ("registers · shared memory", "inside each SM: a fused kernel keeps its intermediates here", "#55a868"),
    ("L2 cache", "shared by all SMs", "#8ebf8a"),
    ("device memory (HBM)", "every eager op reads its inputs and writes its output here", "#4c72b0"),
    ("host memory (CPU)", "across PCIe or NVLink-C2C: .item(), .cpu() and copies to the host", "#8172b2"),
)


def draw(
    *,
    copy_gbps: float | None = None,
    peak_tflops: float | None = None,
    l2_mib: float | None = None,
    peak_name: str = "matmul",
) -> Figure:
    """The two panels, with the run's measured or reported numbers (``peak_name``: the ceiling's name) when given."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1.25, 1]})
    _hierarchy(left, copy_gbps, l2_mib)
    _roofline(right, copy_gbps, peak_tflops, peak_name)
    fig.tight_layout()
    return fig


def _hierarchy(ax, copy_gbps: float | None, l2_mib: float | None) -> None:
    ax.set(xlim=(-0.13, 1), ylim=(-0.02, 1.06))
    ax.axis("off")
    ax.set_title("Where the bytes live", fontsize=12)
    notes = {1: l2_mib and f"{l2_mib:g} MiB on this GPU", 2: copy_gbps and f"measured copy: {copy_gbps:,.0f} GB/s"}
    h, gap = 0.2, 0.045
    for i, (name, sub, color) in enumerate(LEVELS):
        w = 0.56 + 0.13 * i
        x0, y0 = 0.56 - w / 2 + 0.02, 1.0 - (i + 1) * h - i * gap
        ax.add_patch(
            FancyBboxPatch((x0, y0), w, h, boxstyle="round,pad=0.005", fc=color, ec="none", alpha=0.25 if i else 0.35)
        )
        ax.text(x0 + w / 2, y0 + h * 0.7, name, ha="center", va="center", fontsize=10.5, weight="bold")
        ax.text(x0 + w / 2, y0 + h * 0.4, sub, ha="center", va="center", fontsize=8.5)
        if notes.get(i):
            ax.text(x0 + w / 2, y0 + h * 0.15, notes[i], ha="center", va="center", fontsize=8.5, style="italic")
    ax.annotate("", (0.0, 0.98), (0.0, 0.02), arrowprops={"arrowstyle": "<->", "lw": 1.2, "color": "0.3"})
    ax.text(-0.02, 0.9, "faster,\nsmaller", ha="right", va="top", fontsize=8.5, color="0.3")
    ax.text(-0.02, 0.1, "larger,\nslower", ha="right", va="bottom", fontsize=8.5, color="0.3")


def _roofline(ax, copy_gbps: float | None, peak_tflops: float | None, peak_name: str) -> None:
    ax.set(xlim=(0, 10), ylim=(0, 6.6))
    ridge_x, roof_y = 5.5, 4.6
    ax.add_patch(Polygon([(0, 0), (ridge_x, 0), (ridge_x, 6.6), (0, 6.6)], fc="#4c72b0", alpha=0.07, ec="none"))
    ax.add_patch(Polygon([(ridge_x, 0), (10, 0), (10, 6.6), (ridge_x, 6.6)], fc="#c44e52", alpha=0.06, ec="none"))
    ax.plot([0.4, ridge_x, 9.8], [roof_y - (ridge_x - 0.4) * 0.8, roof_y, roof_y], color="black", lw=2.2)
    ax.plot([ridge_x, ridge_x], [0, roof_y], color="0.4", ls=":", lw=1.2)
    ax.text(2.6, 6.15, "memory-bound", ha="center", fontsize=10.5, color="#4c72b0", weight="bold")
    ax.text(7.75, 6.15, "compute-bound", ha="center", fontsize=10.5, color="#c44e52", weight="bold")
    ax.text(7.65, roof_y + 0.3, "roof: peak FLOP/s", ha="center", fontsize=9)
    ax.text(3.55, 1.55, "slope: bandwidth ×\narithmetic intensity", ha="left", va="center", fontsize=9)
    ridge = "ridge point\n= peak / bandwidth"
    if copy_gbps and peak_tflops:
        ridge += f"\n= {peak_tflops * 1e12 / (copy_gbps * 1e9):,.0f} FLOP/byte here ({peak_name})"
    ax.text(ridge_x + 0.15, 0.3, ridge, ha="left", va="bottom", fontsize=8.5)
    ax.plot([1.3], [roof_y - (ridge_x - 1.3) * 0.8 - 0.45], "o", color="#4c72b0", ms=7)
    ax.text(1.5, roof_y - (ridge_x - 1.3) * 0.8 - 0.45, "elementwise op", va="center", fontsize=8.5)
    ax.plot([8.4], [roof_y - 0.45], "o", color="#c44e52", ms=7)
    ax.text(8.4, roof_y - 0.95, "large matmul", ha="center", fontsize=8.5)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved, log scale)")
    ax.set_ylabel("attainable FLOP/s (log scale)")
    ax.set_title("The roofline: which limit applies", fontsize=12)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
