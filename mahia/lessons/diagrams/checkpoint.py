"""The checkpoint timeline (notebook 07): one training step of ``n`` blocks per policy, the work in time order
(forward F, loss, backward B, recompute R) above the activation memory kept for backward. ``input_share`` and
``selective_share`` (of one block's activations) come from the notebook's measurements."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

__all__ = ["POLICIES", "draw", "timeline"]

POLICIES = ("none", "full", "selective")
HOST, DEVICE, MEMORY, BACKWARD = "#dd8452", "#4c72b0", "#8172b2", "#55a868"
_TITLES = {
    "none": "no checkpointing: every block's activations stay until its backward",
    "full": "full: keep each block's input, rerun its forward (R) just before its backward",
    "selective": "selective: keep matmul and attention outputs, rerun only the pointwise ops (r)",
}
# Durations in units of one block's forward: a backward costs about two forwards; the loss (head) and a
# selective recompute (pointwise ops only) less than one.
_T_FWD, _T_BWD, _T_LOSS, _T_SEL = 1.0, 2.0, 0.6, 0.35


def timeline(policy: str, n_blocks: int, *, input_share: float = 0.15, selective_share: float = 0.6) -> list[dict]:
    """The step as a list of ``{"label", "kind", "start", "end", "memory"}``, ``memory`` being the
    activations kept (in blocks' worth) once that piece of work has ended."""
    kept = {"none": 1.0, "full": input_share, "selective": selective_share}[policy]
    out, t, mem = [], 0.0, 0.0

    def add(label, kind, dt, dmem):
        nonlocal t, mem
        mem += dmem
        out.append({"label": label, "kind": kind, "start": t, "end": t + dt, "memory": mem})
        t += dt

    for i in range(1, n_blocks + 1):
        add(f"F{i}", "forward", _T_FWD, kept)
    add("loss", "loss", _T_LOSS, 0.0)
    for i in range(n_blocks, 0, -1):
        if policy == "full":
            add(f"R{i}", "recompute", _T_FWD, 1.0)
        elif policy == "selective":
            add(f"r{i}", "recompute", _T_SEL, 1.0 - kept)
        # the backward frees the block's activations (and, under full checkpointing, its kept input too)
        add(f"B{i}", "backward", _T_BWD, -(1.0 + kept if policy == "full" else 1.0))
    return out


def draw(n_blocks: int = 4, policies=POLICIES, *, input_share: float = 0.15, selective_share: float = 0.6):
    """The timelines of ``policies`` (any of "none", "full", "selective"), one above the other."""
    steps = {p: timeline(p, n_blocks, input_share=input_share, selective_share=selective_share) for p in policies}
    t_max = max(s[-1]["end"] for s in steps.values())
    m_max = max(r["memory"] for s in steps.values() for r in s)
    fig = plt.figure(figsize=(10, 2.2 * len(policies) + 0.7))
    # One flat grid (a tight layout, used when saving, handles it): the legend's thin row, then per policy a
    # timeline row and a memory row, with an empty row between policies.
    ratios = [0.3] + [r for k in range(len(policies)) for r in ([0.5] if k else []) + [1.0, 1.3]]
    grid = fig.add_gridspec(len(ratios), 1, height_ratios=ratios)
    fig.subplots_adjust(left=0.06, right=0.98, top=0.97, bottom=0.06, hspace=0.3)
    colors = {"forward": DEVICE, "loss": "0.6", "recompute": HOST, "backward": BACKWARD}
    for k, policy in enumerate(policies):
        row = 1 + 3 * k  # after the legend row; each earlier policy took a timeline, a memory and a spacer row
        work = fig.add_subplot(grid[row])
        mem = fig.add_subplot(grid[row + 1], sharex=work)
        for r in steps[policy]:
            w = r["end"] - r["start"]
            work.add_patch(plt.Rectangle((r["start"], 0.1), w, 0.8, fc=colors[r["kind"]], ec="black", lw=0.6))
            ink = "white" if r["kind"] in ("forward", "backward") else "black"
            size = 7.5 if w >= 0.5 else 6  # a selective recompute (r) is narrow: a smaller font still names it
            work.text(r["start"] + w / 2, 0.5, r["label"], ha="center", va="center", fontsize=size, color=ink)
        work.set_ylim(0, 1)
        work.axis("off")
        work.set_title(_TITLES[policy], loc="left", fontsize=9)
        # linear within each piece of work: a forward or a recompute builds its activations while it runs, a
        # backward frees them while it runs (a step at the piece's end would show them rebuilt after the fact)
        times = [0.0] + [r["end"] for r in steps[policy]]
        levels = [0.0] + [r["memory"] for r in steps[policy]]
        mem.fill_between(times, levels, color=MEMORY, alpha=0.45, lw=0)
        mem.plot(times, levels, color=MEMORY, lw=1.2)
        top = max(levels)
        at = times[levels.index(top)]
        peak = f"peak: {top:.2g} × one block's activations"
        mem.annotate(peak, (at, top), xytext=(4, 2), textcoords="offset points", fontsize=7.5, va="bottom")
        mem.set(ylim=(0, m_max * 1.25), xlim=(0, t_max), yticks=[], xticks=[])
        mem.set_ylabel("kept", fontsize=8)
        mem.grid(False)
    mem.set_xlabel("time (one block's forward = 1)", fontsize=8)
    handles = [Patch(facecolor=c, edgecolor="black", lw=0.6, label=k) for k, c in colors.items()]
    handles.append(Patch(facecolor=MEMORY, alpha=0.45, label="activations kept for backward"))
    key = fig.add_subplot(grid[0])
    key.axis("off")
    key.legend(handles=handles, loc="center", ncol=len(handles), fontsize=8, frameon=False)
    return fig
