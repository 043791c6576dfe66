"""FlashAttention's tiling (notebook 02): the score matrix S = Q Kᵀ in tiles of (query block, key block); one
program owns a query block, walks the key blocks with an online softmax and writes its output once, so no
tile of scores reaches device memory. Causal: tiles above the diagonal are skipped, those on it half masked."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

__all__ = ["draw"]

Q, K, V, O, TILE, SKIP = "#dd8452", "#4c72b0", "#8172b2", "#55a868", "#ccb974", "#dddddd"

NOTES = (
    ("one program per query block", "it loads Qi once and keeps its running output on chip"),
    ("a tile of scores Qi·Kjᵀ at a time", "in registers and shared memory, never in device memory"),
    ("online softmax", "running max m and sum ℓ; when m grows, the partial output is rescaled"),
    ("device memory sees Q, K, V and O only", "the textbook path writes the whole T×S score matrix there"),
)


def draw(*, blocks: int = 4, causal: bool = True, row: int | None = None) -> Figure:
    """The tiling with ``blocks`` (2 to 8) query and key blocks; ``row``: the highlighted program's query block
    (default: the third from the top, or the last if there are fewer)."""
    row = min(2, blocks - 1) if row is None else row
    n = blocks
    fig, ax = plt.subplots(figsize=(13, 5.6))
    gx, gy = 2.0, 1.6  # the grid's lower-left corner; tile (i, j) at column j, row i from the top
    notes = list(NOTES)
    if causal:
        notes.append(("causal", "grey tiles (keys after the queries) are skipped; hatched ones are half masked"))
    lowest = gy + n + 0.9 - (len(notes) - 1) * 1.15 - 0.9  # the last note's second line, and a margin
    ax.set(xlim=(-0.6, gx + n + 11.5), ylim=(min(-0.2, lowest), gy + n + 2.1), aspect="equal")
    ax.axis("off")

    def tile_xy(i: int, j: int) -> tuple[float, float]:
        return gx + j, gy + n - 1 - i

    for i in range(n):
        for j in range(n):
            x, y = tile_xy(i, j)
            skipped = causal and j > i
            color = SKIP if skipped else (TILE if i == row else "#f3eed8")
            ax.add_patch(Rectangle((x, y), 1, 1, fc=color, ec="white", lw=2))
            if causal and j == i:
                ax.add_patch(Rectangle((x, y), 1, 1, fc="none", ec="0.5", hatch="//", lw=0))
        qx, qy = gx - 1.35, gy + n - 1 - i
        ax.add_patch(Rectangle((qx, qy), 1, 1, fc=Q, alpha=1 if i == row else 0.35, ec="white", lw=2))
        ax.text(qx + 0.5, qy + 0.5, f"Q{i}", ha="center", va="center", fontsize=9, color="white", weight="bold")
        ox = gx + n + 0.35
        ax.add_patch(Rectangle((ox, qy), 1, 1, fc=O, alpha=1 if i == row else 0.35, ec="white", lw=2))
        ax.text(ox + 0.5, qy + 0.5, f"O{i}", ha="center", va="center", fontsize=9, color="white", weight="bold")
    for j in range(n):
        kx = gx + j
        ax.add_patch(Rectangle((kx, gy + n + 0.35), 1, 1, fc=K, ec="white", lw=2))
        ax.text(kx + 0.5, gy + n + 0.85, f"K{j}ᵀ", ha="center", va="center", fontsize=9, color="white")
        ax.add_patch(Rectangle((kx, gy - 1.35), 1, 1, fc=V, ec="white", lw=2))
        ax.text(kx + 0.5, gy - 0.85, f"V{j}", ha="center", va="center", fontsize=9, color="white")
    last = row if causal else n - 1
    y_row = gy + n - 1 - row + 0.5
    ax.annotate(
        "", (gx + last + 0.85, y_row), (gx + 0.15, y_row), arrowprops={"arrowstyle": "->", "lw": 1.6, "color": "k"}
    )
    ax.text(gx + n / 2, gy + n + 1.6, "S = Q·Kᵀ, one tile per (query block, key block)", ha="center", fontsize=9.5)
    nx = gx + n + 2.0
    for k, (head, body) in enumerate(notes):
        y = gy + n + 0.9 - k * 1.15
        ax.text(nx, y, head, fontsize=10, weight="bold", va="center")
        ax.text(nx, y - 0.42, body, fontsize=9, va="center")
    ax.set_title(f"FlashAttention tiling: the program of Q{row} walks the key blocks", fontsize=12)
    fig.tight_layout()
    return fig
