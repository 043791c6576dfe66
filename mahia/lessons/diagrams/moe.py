"""The grouped MoE forward (notebook 08): the ``N·k`` (token, expert) rows sorted by expert (``argsort``),
``offs = cumsum(rows per expert)`` on the device, a grouped GEMM by each expert's ``W13`` (D x 2H), SwiGLU
row by row (2H -> H), a grouped GEMM by ``W2`` (H x D), and the combine: each token sums its ``k`` results,
weighted by its gates. ``draw(assignments=[(0, 1), (1, 2), ...])``: one tuple of experts per token."""

from __future__ import annotations

from collections.abc import Sequence

from mahia.lessons.diagrams._sketch import EXPERT_COLORS, box, canvas, caption, heading

__all__ = ["DEFAULT_ASSIGNMENTS", "draw", "permutation"]

# Six tokens, three experts, top-2: unequal groups (5, 4 and 3 rows), as a router makes them.
DEFAULT_ASSIGNMENTS = ((0, 2), (1, 0), (0, 1), (2, 0), (0, 1), (1, 2))


def permutation(assignments: Sequence[Sequence[int]], n_experts: int) -> tuple[list[tuple[int, int]], list[int]]:
    """The (token, expert) rows sorted by expert (stable: tokens in order within an expert) and
    ``offs``, the cumulative row count at the end of each expert's block: what ``argsort`` and
    ``cumsum`` compute in the grouped path."""
    rows = sorted(((t, e) for t, experts in enumerate(assignments) for e in experts), key=lambda r: r[1])
    return rows, [sum(1 for _, x in rows if x <= e) for e in range(n_experts)]


def draw(assignments: Sequence[Sequence[int]] = DEFAULT_ASSIGNMENTS, n_experts: int | None = None):
    """The diagram for ``assignments`` (the k experts of each token; at most 8 experts and 10 tokens fit)."""
    assignments = [tuple(a) for a in assignments]
    n_experts = n_experts or 1 + max(e for a in assignments for e in a)
    rows, offs = permutation(assignments, n_experts)
    k = len(assignments[0])
    n_rows = len(rows)
    rh = 1.6  # height of one (token, expert) row
    top = n_rows * rh + 3.5  # the rows end 3.5 units above the bottom, where the caption is
    fig, ax = canvas(100, top + 4, figsize=(10, 0.3 * (top + 4)))
    color = lambda e: EXPERT_COLORS[e]
    y_row = lambda i: top - (i + 1) * rh  # lower edge of sorted row i
    tok_h = k * rh  # a token spans the height of its k rows
    y_tok = lambda t: top - (t + 1) * tok_h

    heading(ax, 1, top + 2.2, "tokens\n(top-k)")
    heading(ax, 17, top + 2.2, "permute\n(argsort)")
    heading(ax, 31, top + 2.2, "grouped\nGEMM 1")
    heading(ax, 46, top + 2.2, "SwiGLU")
    heading(ax, 58, top + 2.2, "grouped\nGEMM 2")
    heading(ax, 82, top + 2.2, "combine\n(× gate, Σ over k)")
    for t, experts in enumerate(assignments):
        y = y_tok(t) + 0.2
        box(ax, 1, y, 12, tok_h - 0.4, f"x{t} → " + ", ".join(f"e{e}" for e in experts), fontsize=7.5)
        box(ax, 86, y, 12, tok_h - 0.4, f"y{t} = Σ g·o", fontsize=7.5)
    for i, (t, e) in enumerate(rows):
        y = y_row(i)
        box(ax, 20, y + 0.1, 7, rh - 0.2, f"x{t}", color=color(e), text_color="white", fontsize=7.5)
        box(ax, 72, y + 0.1, 7, rh - 0.2, f"o{t},{e}", color=color(e), text_color="white", fontsize=7)
        # gather (token -> its row) and combine (row -> its token), drawn as thin lines
        src = [p for p, a in enumerate(assignments[t]) if a == e][0]
        y_src = y_tok(t) + tok_h * (1 - (src + 0.5) / k)
        ax.plot([13, 20], [y_src, y + rh / 2], color=color(e), lw=0.8, alpha=0.8)
        ax.plot([79, 86], [y + rh / 2, y_src], color=color(e), lw=0.8, alpha=0.8)
    # SwiGLU acts on each row alone: one band over every row, between the two grouped GEMMs
    box(ax, 45, y_row(n_rows - 1) + 0.1, 9, n_rows * rh - 0.2, "silu(h₁)·h₃\n2H → H\nper row", fontsize=7.5)
    start = 0
    for e, end in enumerate(offs):
        if end > start:
            y_lo, y_hi = y_row(end - 1), y_row(start) + rh
            y_mid = (y_lo + y_hi) / 2
            for x0, label in ((30, f"rows @ W13[{e}]"), (57, f"rows @ W2[{e}]")):
                text = f"{label}\n({end - start} rows)"
                box(
                    ax,
                    x0,
                    y_lo + 0.1,
                    12,
                    y_hi - y_lo - 0.2,
                    text,
                    color=color(e),
                    text_color="white",
                    fontsize=7,
                    alpha=0.85,
                )
            for x0, x1 in ((27, 30), (42, 45), (54, 57), (69, 72)):
                ax.plot([x0, x1], [y_mid] * 2, color="0.4", lw=0.8)
            white = {"facecolor": "white", "edgecolor": "none", "pad": 0.5}
            caption(ax, 19.5, y_lo, f"offs[{e}] = {end}", ha="right", fontsize=7, bbox=white)
        start = end
    note = (
        f"{len(assignments)} tokens × top-{k} = {n_rows} (token, expert) rows. offs = cumsum(rows per expert) stays "
        "on the device: no host sync.\nTwo grouped GEMMs (one launch each) with SwiGLU between them, then one combine."
    )
    caption(ax, 1, 1.6, note, fontsize=7.5)
    return fig
