"""Capture and replay of a CUDA graph (notebook 05), as three timelines: eager (the device idles between
launches), capture (the kernels are recorded with fixed addresses: the static input, allocated before, and
the graph's pool) and replay (copy the input in, one launch, the kernels back to back)."""

from __future__ import annotations

from mahia.lessons.diagrams._sketch import DEVICE, HOST, IDLE, MEMORY, arrow, box, canvas, caption, heading

__all__ = ["draw"]


def draw(n_kernels: int = 4):
    """The three timelines for a step of ``n_kernels`` kernels (2 to 6 fit)."""
    fig, ax = canvas(100, 66, figsize=(10, 6.6))
    kernels = [f"k{i + 1}" for i in range(n_kernels)]
    launch_w, kern_w, x0 = 9.0, 3.5, 11.0

    # Eager: launch i on the host, kernel i on the device once that launch is done.
    heading(ax, 1, 63, "Eager: the host launches every kernel, one after the other")
    caption(ax, 1, 56.5, "host")
    caption(ax, 1, 49.5, "device")
    ends = []
    for i, k in enumerate(kernels):
        xl = x0 + i * (launch_w + 1.5)
        box(ax, xl, 54.5, launch_w, 4, f"launch {k}", color=HOST, fontsize=7.5)
        box(ax, xl + launch_w, 47.5, kern_w, 4, k, color=DEVICE, text_color="white", fontsize=7.5)
        ends.append(xl + launch_w + kern_w)
    for i in range(n_kernels - 1):  # between two kernels the device waits for the next launch
        gap_hi = x0 + (i + 1) * (launch_w + 1.5) + launch_w
        box(ax, ends[i], 47.5, gap_hi - ends[i], 4, color=IDLE, hatch="///", lw=0.4)
    caption(ax, ends[0], 44.5, "hatched: the device idles, the next launch has not arrived", fontsize=7.5)

    # Capture: the step runs once under torch.cuda.graph; its kernels are recorded, not run.
    heading(ax, 1, 39, "Capture (once): the kernels are recorded, not run")
    caption(ax, 1, 33.5, "host")
    box(ax, x0, 31.5, 38, 4, "with torch.cuda.graph(g):  out = fn(static_in)", color=HOST, fontsize=7.5)
    arrow(ax, (x0 + 38.5, 33.5), (x0 + 43, 33.5))
    chain = " → ".join(kernels)
    box(ax, x0 + 43.5, 31.5, 44, 4, f"graph g: {chain}, fixed addresses", color="white", fontsize=7.5, ls="--")
    caption(ax, 1, 26.5, "memory")
    # static_in is allocated (cloned) before the capture, so it lives in the ordinary allocator, not in the pool
    box(ax, x0, 24.5, 27, 4, "static_in: allocated before capture", color="white", fontsize=7.5)
    pool = "memory pool of g (pool=): temporaries and out, kept as long as g lives"
    box(ax, x0 + 28, 24.5, 59.5, 4, pool, color=MEMORY, text_color="white", fontsize=7.5, alpha=0.85)

    # Replay: copy the new input in place, one launch, the recorded kernels back to back.
    heading(ax, 1, 19, "Replay (every step): one launch for the whole step")
    caption(ax, 1, 13.5, "host")
    caption(ax, 1, 6.5, "device")
    box(ax, x0, 11.5, 16, 4, "static_in.copy_(x)", color=HOST, fontsize=7.5)
    box(ax, x0 + 16.5, 11.5, 11, 4, "g.replay()", color=HOST, fontsize=7.5)
    box(ax, x0 + 16, 4.5, kern_w, 4, "copy", color=DEVICE, text_color="white", fontsize=6.5)
    start = x0 + 16.5 + 11
    for i, k in enumerate(kernels):
        box(ax, start + i * kern_w, 4.5, kern_w, 4, k, color=DEVICE, text_color="white", fontsize=7.5)
    caption(ax, start + n_kernels * kern_w + 1.5, 6.5, "back to back: no launch gaps", fontsize=7.5)
    arrow(ax, (x0, 1.2), (98, 1.2), color="0.5", lw=0.8)
    caption(ax, 98, 2.6, "time", ha="right", fontsize=7.5, color="0.4")
    return fig
