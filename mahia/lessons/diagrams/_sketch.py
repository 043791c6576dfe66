"""Drawing pieces shared by the diagrams of notebooks 05-09: a blank canvas in diagram units, labelled boxes,
arrows and captions (the tests check with the Agg renderer that no two labels overlap)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

# One colour per role in every diagram: host work, device work, memory, and the idle device.
HOST = "#dd8452"
DEVICE = "#4c72b0"
MEMORY = "#8172b2"
IDLE = "#eeeeee"
EXPERT_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860", "#da8bc3", "#8c8c8c")


def canvas(width: float, height: float, *, figsize: tuple[float, float]):
    """A figure with one axes spanning ``width`` x ``height`` diagram units, no frame, no ticks."""
    fig, ax = plt.subplots(figsize=figsize)  # a subplot: saving (tight_layout) only trims the margins
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.99)
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    return fig, ax


def box(
    ax, x, y, w, h, text="", *, color="white", text_color="black", fontsize=8, hatch=None, alpha=1.0, lw=0.8, ls="-"
):
    """A rectangle with its lower-left corner at (x, y) and ``text`` centred in it; returns the text (or None)."""
    ax.add_patch(
        Rectangle((x, y), w, h, facecolor=color, edgecolor="black", lw=lw, ls=ls, hatch=hatch, alpha=alpha, zorder=2)
    )
    if not text:
        return None
    return ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color, zorder=3)


def arrow(ax, start: tuple[float, float], end: tuple[float, float], *, color: str = "0.3", lw: float = 1.0, ls="-"):
    """An arrow from ``start`` to ``end`` (diagram units)."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9, color=color, lw=lw, ls=ls, zorder=1))


def caption(ax, x: float, y: float, text: str, *, fontsize: float = 8, ha: str = "left", va: str = "center", **kw):
    """Free text at (x, y)."""
    return ax.text(x, y, text, ha=ha, va=va, fontsize=fontsize, zorder=3, **kw)


def heading(ax, x: float, y: float, text: str, *, fontsize: float = 9.5):
    """A section heading (bold) at (x, y)."""
    return ax.text(x, y, text, ha="left", va="center", fontsize=fontsize, fontweight="bold", zorder=3)
