"""Point labels that do not overlap, on a log-log plot (used by notebook 03's roofline, where the
pointwise kernels cluster).

    ax = plotting.roofline(points, ceilings, ...)
    spread_labels(ax)      # the labels plotting.roofline wrote, re-placed
"""

from __future__ import annotations

import math

__all__ = ["spread_labels"]


def spread_labels(ax, gap: float = 0.075, *, width: float = 0.35, offset: float = 0.06) -> list[tuple[float, float]]:
    """Re-place the text labels of ``ax`` (log-log axes): from the highest point down, a label that would
    overlap one already placed moves down by ``gap`` decades until it is free, joined to its point by a
    thin line. Labels overlap when they are within ``width`` decades in x and ``gap`` in y; each starts
    ``offset`` decades right of its point. Returns the labels' (log10 x, log10 y) positions, in order."""
    anns = [(a.get_text().strip(), a.xy) for a in ax.texts]
    for a in list(ax.texts):
        a.remove()
    placed: list[tuple[float, float]] = []
    for text, (x, y) in sorted(anns, key=lambda t: -t[1][1]):
        lx, ly = math.log10(x) + offset, math.log10(y)
        while any(abs(lx - px) < width and abs(ly - py) < gap for px, py in placed):
            ly -= gap
        placed.append((lx, ly))
        moved = abs(ly - math.log10(y)) > 1e-9
        ax.annotate(
            text,
            (x, y),
            xytext=(10**lx, 10**ly),
            textcoords="data",
            fontsize=8,
            va="center",
            arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.5"} if moved else None,
        )
    return placed
