"""The host's launch queue and the device's work, without and with a sync (notebook 01). A launch only queues
a kernel. Top: no sync, the host runs ahead. Bottom: after the ``sync_after``-th launch the host needs a value
(``loss.item()``): it waits for the queue to drain, then the device waits for the next launch. Durations are
in arbitrary units: ``draw(kernels=8, sync_after=5, launch=1.0, kernel=0.6)`` is a launch-bound step."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

__all__ = ["draw", "timeline"]

HOST, DEVICE, WAIT, IDLE, COPY = "#8172b2", "#4c72b0", "#c44e52", "#bbbbbb", "#dd8452"


def timeline(kernels: int, sync_after: int | None, launch: float, kernel: float, copy: float) -> dict:
    """The schedule both panels draw: ``launches`` and ``runs`` ((start, end) per kernel), and for a sync the
    host's ``wait`` and the device's ``copy`` and ``idle`` intervals; ``end``: when the last kernel ends."""
    launches, runs, t_host, t_dev = [], [], 0.0, 0.0
    out: dict = {}
    for i in range(kernels):
        launches.append((t_host, t_host + launch))
        t_host += launch
        start = max(t_host, t_dev)
        runs.append((start, start + kernel))
        t_dev = start + kernel
        if sync_after is not None and i + 1 == sync_after:
            out["wait"] = (t_host, t_dev + copy)
            out["copy"] = (t_dev, t_dev + copy)
            t_host = t_dev = t_dev + copy
            out["idle"] = (t_dev, t_host + launch if i + 1 < kernels else t_dev)
    out.update(launches=launches, runs=runs, end=t_dev)
    return out


def draw(
    *, kernels: int = 6, sync_after: int = 3, launch: float = 1.0, kernel: float = 1.6, copy: float = 0.5
) -> Figure:
    """The two panels: ``launch``, ``kernel``, ``copy`` are the host's time per launch, the device's per kernel
    and the copy of the value back (``1 <= sync_after < kernels``)."""
    free = timeline(kernels, None, launch, kernel, copy)
    synced = timeline(kernels, sync_after, launch, kernel, copy)
    span = synced["end"] * 1.02
    fig, axes = plt.subplots(2, 1, figsize=(12, 5.6), sharex=True)
    _panel(axes[0], free, launch, kernel, "No sync: the host runs ahead, kernels queue on the device", span)
    title = f"A sync after launch {sync_after} (loss.item()): the queue drains, then the device waits for the host"
    _panel(axes[1], synced, launch, kernel, title, span)
    lost = {"arrowstyle": "<->", "lw": 1.2, "color": WAIT}
    axes[1].annotate("", (synced["end"], -0.62), (free["end"], -0.62), arrowprops=lost)
    axes[1].text((free["end"] + synced["end"]) / 2, -0.95, "time lost to the sync", ha="center", fontsize=9)
    axes[0].plot([free["end"]] * 2, [-0.45, 1.45], color="0.3", lw=1, ls="--")
    axes[1].plot([free["end"]] * 2, [-0.45, 1.45], color="0.3", lw=1, ls="--")
    axes[1].set_xlabel("time →")
    axes[1].set_xticks([])
    fig.tight_layout()
    return fig


def _panel(ax, tl: dict, launch: float, kernel: float, title: str, span: float) -> None:
    ax.set(xlim=(-0.6, span), ylim=(-1.15, 1.6))
    ax.set_yticks([1, 0], ["host\n(Python)", "device\n(GPU)"])
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.grid(False)
    for i, (a, b) in enumerate(tl["launches"]):
        ax.add_patch(Rectangle((a, 0.7), b - a - 0.06, 0.6, fc=HOST, alpha=0.75, ec="white"))
        ax.text((a + b) / 2, 1.0, f"L{i + 1}", ha="center", va="center", fontsize=8.5, color="white")
    for i, (a, b) in enumerate(tl["runs"]):
        ax.add_patch(Rectangle((a, -0.3), b - a - 0.06, 0.6, fc=DEVICE, alpha=0.85, ec="white"))
        ax.text((a + b) / 2, 0.0, f"K{i + 1}", ha="center", va="center", fontsize=8.5, color="white")
    if "wait" in tl:
        a, b = tl["wait"]
        ax.add_patch(Rectangle((a, 0.7), b - a, 0.6, fc="none", ec=WAIT, hatch="///", lw=1))
        ax.text((a + b) / 2, 1.48, "host waits", ha="center", va="center", fontsize=8.5, color=WAIT)
        a, b = tl["copy"]
        ax.add_patch(Rectangle((a, -0.3), b - a, 0.6, fc=COPY, alpha=0.85, ec="white"))
        ax.text((a + b) / 2, -0.45, "copy", ha="center", va="center", fontsize=8, color=COPY)
        a, b = tl["idle"]
        if b > a:
            ax.add_patch(Rectangle((a, -0.3), b - a, 0.6, fc="none", ec=IDLE, hatch="...", lw=1))
            ax.text((a + b) / 2, -0.45, "device idle", ha="center", va="top", fontsize=8, color="0.35")
    ax.set_title(title, fontsize=10.5, loc="left")
