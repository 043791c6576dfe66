"""What every notebook does first, and a few display helpers.

    ctx = mahia.lessons.notebook.setup("03_triton_fusion", device=device, profile=profile, seed=seed,
                               results_dir=results_dir)

returns a ``Context``: the resolved device, the profile, the measured ceilings, a results
``Recorder`` and the figures folder, and prints the device report. Notebooks measure through
``ctx.bench`` (which is ``mahia.measure.timing.bench`` bound to the device and the profile's budgets).
"""

from __future__ import annotations

import html
import inspect
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mahia.measure import hardware
from mahia.measure.checks import check_int
from mahia.measure.results import Recorder, default_figures_dir
from mahia.measure.timing import Timing, bench

__all__ = ["PROFILES", "Context", "setup", "show_source", "side_by_side", "headless", "md", "explorer"]

PROFILES = ("quick", "full")


def headless() -> bool:
    """True under the runner (papermill) or when no notebook front end is attached."""
    return os.environ.get("MAHIA_HEADLESS") == "1"


@dataclass
class Context:
    notebook: str
    device: torch.device
    profile: str
    seed: int
    ceilings: hardware.Ceilings
    recorder: Recorder
    figures: Path
    report: dict = field(default_factory=dict)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def quick(self) -> bool:
        return self.profile == "quick"

    @property
    def device_note(self) -> str:
        """'<device>, <date>' for plot titles; says when it is a CPU run."""
        name = self.report.get("gpu") or f"CPU run: {self.report.get('cpu')}"
        return f"{name}, {self.recorder._stamp()['date'][:10]}"

    def bench(self, fn: Callable[[], object], **kw) -> Timing:
        kw.setdefault("rep_ms", 40 if self.quick else 200)
        kw.setdefault("warmup_ms", 10 if self.quick else 50)
        return bench(fn, device=self.device, **kw)

    def save(self, fig_or_ax, name: str) -> list[Path]:
        from mahia.measure.plotting import save

        return save(fig_or_ax, f"{self.notebook}_{name}", self.figures)

    def pick(self, quick, full):
        """The quick-profile value or the full-profile one."""
        return quick if self.quick else full


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup(
    notebook: str,
    *,
    device: str = "auto",
    profile: str = "quick",
    seed: int = 0,
    results_dir: str | None = None,
    figures_dir: str | None = None,
    verbose: bool = True,
    cpu_threads: int | None = None,
    cpu_note: str | None = None,
) -> Context:
    """Resolve the device, check the profile, seed, measure (or reuse) the ceilings, make a recorder.

    ``cpu_threads``: on a CPU run, ``torch.set_num_threads(cpu_threads)`` once the ceilings are measured
    (None leaves PyTorch's default). The notebooks' ops are small: splitting each over threads costs
    more than it saves, and on a busy machine the threads wait for each other, so one thread keeps the
    CPU timings short and steady. ``cpu_note``: what else this notebook does differently on a CPU,
    printed with the set-up report on a CPU run. Neither changes anything on a GPU.
    """
    if cpu_threads is not None:
        check_int("setup", "cpu_threads", cpu_threads)
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    dev = hardware.resolve_device(device)
    seed_everything(int(seed))
    rec_dir = Path(results_dir) if results_dir else None
    ceil = hardware.ceilings(dev, results_dir=rec_dir or _results_root(), quick=(profile == "quick"))
    rec = Recorder(notebook, dev, results_dir=rec_dir, ceilings=ceil)
    figs = (Path(figures_dir) if figures_dir else default_figures_dir()) / rec.slug
    report = hardware.device_report(str(dev))
    ctx = Context(notebook, dev, profile, int(seed), ceil, rec, figs, report)
    if verbose:
        kind = "GPU" if ctx.is_cuda else "CPU (CUDA-only parts are skipped and say so)"
        print(f"{notebook}: profile={profile}, device={dev} — {kind}")
        print(f"  {report.get('gpu') or report.get('cpu')} | torch {report['torch']} | triton {report['triton']}")
        print(
            f"  measured ceilings: copy {ceil.copy_gbps:,.0f} GB/s, bf16 matmul "
            f"{ceil.matmul_bf16_tflops:,.4g} TFLOP/s, fp32 matmul {ceil.matmul_fp32_tflops:,.4g} TFLOP/s"
        )
    _cpu_setup(ctx, cpu_threads, cpu_note, verbose)
    return ctx


def _cpu_setup(ctx: Context, threads: int | None, note: str | None, verbose: bool) -> None:
    """The CPU-only part of :func:`setup`: after the ceilings, so they are measured like every other run's."""
    if ctx.is_cuda:
        return
    said = []
    if threads is not None:
        torch.set_num_threads(threads)
        said.append(f"torch.set_num_threads({threads}) for this notebook (small ops: thread fork/join would dominate)")
    if note:
        said.append(note)
    if verbose and said:
        print("CPU run: " + "; ".join(said))


def _results_root() -> Path:
    from mahia.measure.results import default_results_dir

    return default_results_dir()


def md(text: str) -> None:
    """Render Markdown computed by the run (numbers in prose are never typed in)."""
    try:
        from IPython.display import Markdown, display

        display(Markdown(text))
    except ImportError:
        print(text)


def _source(obj) -> str:
    if isinstance(obj, str):
        return obj
    obj = getattr(obj, "fn", obj)  # a @triton.jit kernel wraps the Python function it compiles
    return inspect.getsource(obj)


def side_by_side(before, after, *, titles=("before", "after")) -> str:
    """HTML with the source of two functions (or code strings) side by side."""
    cells = "".join(
        f"<td style='vertical-align:top;width:50%'><b>{html.escape(t)}</b>"
        f"<pre style='font-size:11px'>{html.escape(_source(o))}</pre></td>"
        for t, o in zip(titles, (before, after))
    )
    return f"<table style='width:100%'><tr>{cells}</tr></table>"


def show_source(before, after=None, *, titles=("before", "after")) -> None:
    """Show the code that matters: one object's source, or two side by side."""
    try:
        from IPython.display import HTML, display
    except ImportError:
        print(_source(before) + ("\n# ---- after ----\n" + _source(after) if after is not None else ""))
        return
    if after is None:
        display(HTML(f"<pre style='font-size:11px'>{html.escape(_source(before))}</pre>"))
    else:
        display(HTML(side_by_side(before, after, titles=titles)))


def explorer(interactive: bool, build: Callable[[], object]) -> None:
    """Show an ipywidgets explorer in JupyterLab; skip it (saying so) headless or without widgets."""
    if not interactive or headless():
        print("explorer skipped: not an interactive session (set interactive=True in JupyterLab)")
        return
    try:
        import ipywidgets  # noqa: F401
        from IPython.display import display
    except ImportError:
        print("explorer skipped: ipywidgets is not installed (pip install 'mahia[notebooks]')")
        return
    display(build())
