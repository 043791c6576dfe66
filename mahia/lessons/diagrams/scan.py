"""The chunked scan of gated linear attention (notebook 09): the loop (one dependent step per token) above the
chunked form (a masked matmul inside every chunk, all chunks at once; ``T / C`` dependent steps of the state
between chunks)."""

from __future__ import annotations

from mahia.lessons.diagrams._sketch import DEVICE, HOST, MEMORY, arrow, box, canvas, caption, heading

__all__ = ["draw"]


def draw(n_chunks: int = 4, chunk: int = 4):
    """The loop (``n_chunks * chunk`` steps) above the chunked form; at most 24 tokens in 6 chunks fit."""
    T = n_chunks * chunk
    fig, ax = canvas(100, 57, figsize=(10, 5.7))

    # The loop: one dependent step per token.
    heading(ax, 1, 54.5, f"Loop: one step per token, T = {T} dependent steps")
    step = 96.0 / T
    for t in range(T):
        box(ax, 2 + t * step, 46, step * 0.62, 4.5, f"{t + 1}", color=HOST, fontsize=7)
        if t:
            arrow(ax, (2 + (t - 1) * step + step * 0.62, 48.25), (2 + t * step, 48.25), lw=0.7)
    step_note = "each step: S_t = diag(exp(g_t)) S_(t-1) + k_t v_tᵀ and o_t = S_tᵀ q_t; a few tiny kernels, "
    caption(ax, 2, 42.5, step_note + "and the next step waits for this one (forward and backward)", fontsize=7.5)

    # The chunked form: a masked matmul inside every chunk, in parallel; a short chain of states between.
    heading(ax, 1, 37, f"Chunked: {n_chunks} chunks of C = {chunk} tokens")
    inside = "inside a chunk: (Q_c K_cᵀ ⊙ exp(b_i - b_j), j ≤ i) V_c, one masked matmul per chunk, every chunk at once"
    caption(ax, 2, 33.5, inside, fontsize=7.5)
    width = 96.0 / n_chunks
    cell_w, cell_h = min(2.4, 0.7 * width / chunk), 12.0 / chunk
    grid_top, grid_bottom = 30.5, 18.5
    for c in range(n_chunks):
        x = 2 + c * width
        gx = x + (width - chunk * cell_w) / 2  # the chunk's C x C grid of pairs, centred
        for i in range(chunk):  # row i (query), column j (key): only j <= i interacts
            for j in range(chunk):
                y, on = grid_top - (i + 1) * cell_h, j <= i
                box(
                    ax,
                    gx + j * cell_w,
                    y,
                    cell_w,
                    cell_h,
                    color=DEVICE if on else "white",
                    lw=0.4,
                    alpha=0.9 if on else 1,
                )
        tokens = f"chunk {c + 1}: tokens {c * chunk + 1}-{(c + 1) * chunk}"
        caption(ax, x + width / 2, grid_bottom - 2, tokens, ha="center", fontsize=7.5)

    # The state carried between chunks; the state before a chunk feeds that chunk's output (dashed).
    y_state = 7.5
    for c in range(n_chunks + 1):
        x = 2 + c * width - (4 if c == n_chunks else 0)
        box(ax, x, y_state, 6 if c < n_chunks else 4, 4, f"S{c}", color=MEMORY, text_color="white", fontsize=7.5)
        if c:
            arrow(ax, (2 + (c - 1) * width + 6, y_state + 2), (x, y_state + 2), lw=0.8)
        if c < n_chunks:
            arrow(
                ax,
                (2 + c * width + 3, y_state + 4),
                (2 + c * width + width / 2 - 6, grid_bottom - 3.6),
                lw=0.7,
                ls="--",
            )
    between = f"between chunks: S_c = decay_c · S_(c-1) + K_cᵀ (decay ⊙ V_c), only {n_chunks} dependent steps; "
    caption(ax, 2, 3.5, between + "dashed: each chunk's output adds Q_c S_(c-1), the state before it", fontsize=7.5)
    return fig
