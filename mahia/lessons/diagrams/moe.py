"""The grouped MoE forward (notebook 08): permute, grouped GEMM, SwiGLU, grouped GEMM, combine.

* **tokens**: the router gives every token its top-k experts (and gates);
* **permute**: the ``N·k`` (token, expert) rows are sorted by expert (one ``argsort``) and the tokens
  gathered in that order, so that each expert's rows are contiguous; ``offs = cumsum(tokens per
  expert)`` marks where each expert's rows end, on the device;
* **grouped GEMM 1**: one launch multiplies each expert's block of rows by that expert's ``W13`` (D x 2H);
* **SwiGLU**: ``silu(h1) * h3`` row by row, halving the width to H;
* **grouped GEMM 2**: one launch multiplies each block by that expert's ``W2`` (H x D);
* **combine**: every token reads its ``k`` results back through the inverse permutation, weights them
  by its gates and sums them.

    fig = draw()                                   # 6 tokens, 3 experts, top-2
    fig = draw(assignments=[(0, 1), (1, 2), ...])  # your own routing: one tuple of experts per token
"""

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
    rows = [(t, e) for t, experts in enumerate(assignments) for e in experts]
    if not rows:
        raise ValueError("moe.permutation: assignments is empty")
    bad = [e for _, e in rows if not (isinstance(e, int) and 0 <= e < n_experts)]
    if bad:
        raise ValueError(f"moe.permutation: expert ids must be ints in [0, {n_experts}), got {bad}")
    rows.sort(key=lambda r: r[1])
    offs, n = [], 0
    for e in range(n_experts):
        n += sum(1 for _, x in rows if x == e)
        offs.append(n)
    return rows, offs


def draw(assignments: Sequence[Sequence[int]] = DEFAULT_ASSIGNMENTS, n_experts: int | None = None):
    """The permute → grouped GEMM → SwiGLU → grouped GEMM → combine diagram for ``assignments`` (the experts of each token,
    all of the same length k); returns the Figure."""
    assignments = [tuple(a) for a in assignments]
    ks = {len(a) for a in assignments}
    if len(ks) != 1 or 0 in ks:
        raise ValueError(f"moe.draw: every token needs the same number k >= 1 of experts, got lengths {sorted(ks)}")
    n_experts = n_experts or 1 + max(e for a in assignments for e in a)
    if n_experts > len(EXPERT_COLORS) or len(assignments) > 10:
        raise ValueError(
            f"moe.draw: at most {len(EXPERT_COLORS)} experts and 10 tokens fit, got {n_experts} and {len(assignments)}"
        )
    rows, offs = permutation(assignments, n_experts)
    k = ks.pop()
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
                box(
                    ax,
                    x0,
                    y_lo + 0.1,
                    12,
                    y_hi - y_lo - 0.2,
                    f"{label}\n({end - start} rows)",
                    color=color(e),
                    text_color="white",
                    fontsize=7,
                    alpha=0.85,
                )
            for x0, x1 in ((27, 30), (42, 45), (54, 57), (69, 72)):
                ax.plot([x0, x1], [y_mid] * 2, color="0.4", lw=0.8)
            caption(
                ax,
                19.5,
                y_lo,
                f"offs[{e}] = {end}",
                ha="right",
                va="center",
                fontsize=7,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},
            )
        start = end
    caption(
        ax,
        1,
        1.6,
        f"{len(assignments)} tokens × top-{k} = {n_rows} (token, expert) rows. offs = cumsum(rows per expert) stays "
        "on the device: no host sync.\nTwo grouped GEMMs (one launch each) with SwiGLU between them, then one combine.",
        fontsize=7.5,
    )
    return fig
