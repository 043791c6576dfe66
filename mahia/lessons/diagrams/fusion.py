"""Fusion of memory-bound ops (notebook 03): eager runs one kernel per op, each reading its inputs from device
memory and writing its output back; one fused kernel runs the same ops on registers, reading the inputs once
and writing the result once. ``draw(list(traffic["op"]), name="RMSNorm")`` (aten names are shortened)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

__all__ = ["draw", "short_op"]

OP, FUSED, HBM, READ, WRITE = "#c44e52", "#55a868", "#4c72b0", "#4c72b0", "#dd8452"


def short_op(name: str) -> str:
    """``aten.pow.Tensor_Scalar`` -> ``pow``, ``aten._to_copy.default`` -> ``_to_copy``; other names unchanged."""
    parts = str(name).split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else str(name)


def draw(ops: Sequence[str], *, name: str = "", inputs: str = "x", output: str = "y") -> Figure:
    """The two rows for the chain of ``ops`` (2 to 16) of the function ``name``, with ``inputs`` and ``output``
    (the labels of the fused kernel's one read and one write)."""
    labels = [short_op(o) for o in ops]
    name = f" {name}" if name else ""
    k = len(labels)
    step = 1.75  # one op box and its gap, in data units (about an inch)
    width = k * step
    fig, ax = plt.subplots(figsize=(max(9.0, 1.05 * width + 3.2), 6.2))
    ax.set(xlim=(-2.6, width + 0.6), ylim=(-3.3, 4.2))
    ax.axis("off")
    # eager: one kernel per op, each with a read and a write of device memory
    ax.text(-2.5, 3.75, f"eager{name}: {k} kernels, one per op", fontsize=11, weight="bold", va="center")
    _memory_band(ax, 1.0, width)
    for i, op in enumerate(labels):
        x = i * step
        ax.add_patch(FancyBboxPatch((x + 0.1, 2.3), step - 0.4, 0.75, boxstyle="round,pad=0.03", fc=OP, alpha=0.85))
        ax.text(x + 0.1 + (step - 0.4) / 2, 2.675, op, ha="center", va="center", fontsize=9, color="white")
        _arrow(ax, x + 0.45, 1.45, 2.28, READ)
        _arrow(ax, x + step - 0.65, 2.28, 1.45, WRITE)
    ax.text(-2.5, 2.675, "kernels", fontsize=9, va="center", color="0.3")
    ax.text(-2.5, 1.9, "read ↑  write ↓", fontsize=9, va="center", color="0.3")
    # fused: one kernel, the ops inside on registers
    ax.text(-2.5, -0.05, f"fused{name}: one kernel", fontsize=11, weight="bold", va="center")
    ax.add_patch(FancyBboxPatch((0.05, -1.35), width - 0.3, 0.95, boxstyle="round,pad=0.04", fc=FUSED, alpha=0.25))
    for i, op in enumerate(labels):
        x = i * step
        ax.add_patch(Rectangle((x + 0.2, -1.2), step - 0.6, 0.65, fc=FUSED, alpha=0.8, ec="white"))
        ax.text(x + 0.2 + (step - 0.6) / 2, -0.875, op, ha="center", va="center", fontsize=9, color="white")
    ax.text(-2.5, -0.875, "registers", fontsize=9, va="center", color="0.3")
    _memory_band(ax, -2.9, width)
    _arrow(ax, 0.45, -2.45, -1.42, READ)
    ax.text(0.7, -1.95, f"read {inputs} once", fontsize=9, va="center")
    _arrow(ax, width - 0.75, -1.42, -2.45, WRITE)
    ax.text(width - 1.0, -1.95, f"write {output} once", fontsize=9, va="center", ha="right")
    fig.tight_layout()
    return fig


def _memory_band(ax, y: float, width: float) -> None:
    ax.add_patch(Rectangle((0.0, y), width - 0.2, 0.45, fc=HBM, alpha=0.2, ec="none"))
    ax.text(-2.5, y + 0.225, "device memory", fontsize=9, va="center", color=HBM)


def _arrow(ax, x: float, y0: float, y1: float, color: str) -> None:
    ax.annotate("", (x, y1), (x, y0), arrowprops={"arrowstyle": "-|>", "lw": 1.4, "color": color})
