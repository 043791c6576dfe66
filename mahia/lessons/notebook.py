"""What every notebook does first (:func:`setup`: device, profile, seed, measured ceilings, a results recorder,
the device report; ``ctx.bench`` is ``mahia.measure.timing.bench`` with the profile's budgets), listings of code
and the explorers' settings line."""

from __future__ import annotations

import html
import inspect
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from mahia.measure import hardware
from mahia.measure.files import default_figures_dir, default_results_dir
from mahia.measure.results import Recorder
from mahia.measure.timing import Timing, bench

__all__ = ["PROFILES", "Context", "setup", "show_source", "side_by_side", "explorer", "watch_settings"]

PROFILES = ("quick", "full")


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
        return f"{name}, {datetime.now(timezone.utc):%Y-%m-%d}"

    def bench(self, fn: Callable[[], object], **kw) -> Timing:
        kw.setdefault("rep_ms", 20 if self.quick else 200)
        kw.setdefault("warmup_ms", 5 if self.quick else 50)
        return bench(fn, device=self.device, **kw)

    def save(self, fig_or_ax, name: str) -> list[Path]:
        from mahia.measure.plotting import save

        return save(fig_or_ax, f"{self.notebook}_{name}", self.figures)

    def pick(self, quick, full):
        """The quick-profile value or the full-profile one."""
        return quick if self.quick else full


def sig3(v: float) -> str:
    """Three significant digits, written out (``12300``, ``0.0123``) between 1e-4 and 1e7."""
    if v != v or v in (float("inf"), float("-inf")) or v == 0 or not 1e-4 <= abs(v) < 1e7:
        return f"{v:.3g}"
    v = float(f"{v:.3g}")  # round first: 99.96 is "100", not "100.0"
    return f"{v:.{max(0, 2 - math.floor(math.log10(abs(v))))}f}"


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
    """Resolve the device, check the profile, seed, measure (or reuse) the ceilings, make a recorder. On a CPU
    only: ``torch.set_num_threads(cpu_threads)`` after the ceilings (small ops: one thread keeps timings steady on
    a busy machine), and ``cpu_note`` (what else the notebook does differently there) printed with the report."""
    if profile not in PROFILES:
        raise ValueError(f"setup: profile must be one of {PROFILES}, got {profile!r}")
    dev = hardware.resolve_device(device)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    rec_dir = Path(results_dir) if results_dir else None
    ceil = hardware.ceilings(dev, results_dir=rec_dir or default_results_dir(), quick=(profile == "quick"))
    rec = Recorder(notebook, dev, results_dir=rec_dir, ceilings=ceil)
    figs = (Path(figures_dir) if figures_dir else default_figures_dir()) / rec.slug
    report = hardware.device_report(str(dev))
    ctx = Context(notebook, dev, profile, int(seed), ceil, rec, figs, report)
    # Tables of measured numbers: three significant digits (pandas' default of six decimals hides the result).
    pd.set_option("display.float_format", sig3)
    if verbose:
        kind = "GPU" if ctx.is_cuda else "CPU (CUDA-only parts are skipped and say so)"
        print(f"{notebook}: profile={profile}, device={dev} — {kind}")
        print(f"  {report.get('gpu') or report.get('cpu')} | torch {report['torch']} | triton {report['triton']}")
        print(
            f"  measured ceilings: copy {ceil.copy_gbps:,.0f} GB/s, bf16 matmul "
            f"{ceil.matmul_bf16_tflops:,.4g} TFLOP/s, fp32 matmul {ceil.matmul_fp32_tflops:,.4g} TFLOP/s"
        )
    said = [] if cpu_threads is None else [f"torch.set_num_threads({cpu_threads}) for this notebook (small ops)"]
    said += [cpu_note] if cpu_note else []
    if not ctx.is_cuda and cpu_threads is not None:
        torch.set_num_threads(cpu_threads)
    if verbose and not ctx.is_cuda and said:
        print("CPU run: " + "; ".join(said))
    return ctx


def _source(obj) -> str:
    if isinstance(obj, str):
        return obj
    obj = getattr(obj, "fn", obj)  # a @triton.jit kernel wraps the Python function it compiles
    return inspect.getsource(obj)


# JupyterLab's stylesheet gives rendered HTML's cells and listings text-align: right, white-space: pre-wrap
# and word-break: break-all: a listing would lose its indentation and wrap mid-word. Inline styles win.
PRE_STYLE = (
    "font-size:11px;text-align:left;white-space:pre;word-break:normal;overflow-wrap:normal;"
    "overflow-x:auto;margin:0;padding:4px"
)
CELL_STYLE = "vertical-align:top;text-align:left;width:50%;padding:4px;overflow:hidden"
TABLE_STYLE = "width:100%;table-layout:fixed;border-collapse:collapse"


def _listing(code: str) -> str:
    return f"<pre style='{PRE_STYLE}'>{html.escape(code)}</pre>"


def side_by_side(before, after, *, titles=("before", "after")) -> str:
    """HTML with the source of two functions (or code strings) side by side, in listings that scroll."""
    cells = "".join(
        f"<td style='{CELL_STYLE}'><b>{html.escape(t)}</b>{_listing(_source(o))}</td>"
        for t, o in zip(titles, (before, after))
    )
    return f"<table style='{TABLE_STYLE}'><tr>{cells}</tr></table>"


def show_source(before, after=None, *, titles=("before", "after")) -> None:
    """Show the code that matters: one object's source, or two side by side."""
    from IPython.display import HTML, display

    display(HTML(_listing(_source(before)) if after is None else side_by_side(before, after, titles=titles)))


def explorer(interactive: bool, build: Callable[[], object]) -> None:
    """Show the ipywidgets explorer ``build()`` makes (and runs once) with its settings line
    (:func:`watch_settings`); skip it, saying so, headless or without ipywidgets."""
    if not interactive or os.environ.get("MAHIA_HEADLESS") == "1":  # the runner (papermill) sets it
        print("explorer skipped: not an interactive session (set interactive=True in JupyterLab)")
        return
    try:
        import ipywidgets  # noqa: F401
        from IPython.display import display
    except ImportError:
        print("explorer skipped: ipywidgets is not installed (pip install 'mahia[notebooks]')")
        return
    display(watch_settings(build()))


def _walk(widget) -> list:
    """``widget`` and every widget inside it, depth first."""
    import ipywidgets as w

    return [widget] + [x for child in (widget.children if isinstance(widget, w.Box) else ()) for x in _walk(child)]


def _shown_value(control, state: dict | None = None):
    """A selection's label, else the value; with ``state`` (an update not yet applied), the value it sets."""
    state = state or {}
    labels = getattr(control, "_options_labels", None)  # a selection's labels (synced with the front end)
    if labels is not None:
        index = state.get("index", control.index)
        return None if index is None else labels[index]
    return state.get("value", control.value)


class SettingsLine:
    """The line above an explorer's output: ``running: <settings>`` while a change is computed, then the
    settings that made the output and how long it took; with a button (``trigger``), a change only says so."""

    def __init__(self, controls: list, status, trigger: str | None = None) -> None:
        self.controls, self.status, self.trigger = controls, status, trigger
        self._started: float | None = None
        self._last: str | None = None  # the settings (and time) of the output shown
        if trigger is None:
            self.finish()  # build() ran the explorer once: its output is the current settings'
        else:
            self._show(f"press '{trigger}' to run: {self.settings()}", GREY)

    def settings(self, pending=None, state: dict | None = None) -> str:
        """'name=value, ...' of every control, ``pending``'s from ``state``."""
        parts = [
            f"{c.description or type(c).__name__.lower()}={_shown_value(c, state if c is pending else None)}"
            for c in self.controls
        ]
        return ", ".join(parts) or "no settings"

    def _show(self, text: str, color: str) -> None:
        self.status.value = (
            f"<code style='color:{color};white-space:pre-wrap;text-align:left'>{html.escape(text)}</code>"
        )

    def start(self, pending=None, state: dict | None = None) -> None:
        self._started = time.perf_counter()
        self._show(f"running: {self.settings(pending, state)} ...", AMBER)

    def finish(self) -> None:
        took = ""
        if self._started is not None:
            took = f" ({time.perf_counter() - self._started:.2f} s)"
            self._started = None
        self._last = f"{self.settings()}{took}"
        self._show(self._last, INK)

    def changed(self, _change=None) -> None:
        if self.trigger is None:
            self.finish()  # the explorer's callbacks ran with it: a change made from code, or the front end's
        elif self._started is None:
            shown = f"output: {self._last}; " if self._last else ""
            self._show(f"{shown}set: {self.settings()} (press '{self.trigger}' to run)", GREY)

    def failed(self, error: BaseException) -> None:
        self._started = None
        self._show(f"{self.settings()}: failed, {type(error).__name__}: {error}", RED)


INK, GREY, AMBER, RED = "#333", "#777", "#a60", "#b00"


def watch_settings(widget):
    """Put a :class:`SettingsLine` above an explorer's first ``Output``; return the widget to display. A front-end
    update or a click shows "running: <settings>", runs the explorer's callbacks, then heads their output."""
    import ipywidgets as w

    if not isinstance(widget, w.Widget):  # something else to display: shown as it is
        return widget
    everything = _walk(widget)
    shown = (w.Label, w.HTML, w.HTMLMath, w.Output)
    controls = [x for x in everything if isinstance(x, w.ValueWidget) and not isinstance(x, shown)]
    buttons = [x for x in everything if isinstance(x, w.Button)]
    status = w.HTML(layout=w.Layout(margin="2px 0"))
    line = SettingsLine(controls, status, trigger=(buttons[0].description or "run") if buttons else None)
    for c in controls:
        c.observe(line.changed, names="value")  # after the explorer's own callbacks: they were registered first
        if not buttons:
            _wrap(c, "set_state", line, lambda c=c: c)
    for b in buttons:
        _wrap(b, "click", line, lambda: None)
    outputs = [x for x in everything if isinstance(x, w.Output)]
    parent = next((x for x in everything if isinstance(x, w.Box) and outputs and outputs[0] in x.children), None)
    if parent is not None:
        kids = list(parent.children)
        kids.insert(kids.index(outputs[0]), status)
        parent.children = tuple(kids)
        return widget
    return w.VBox([widget, status])


SETTING_KEYS = frozenset({"value", "index", "label"})  # what the front end sends when a reader sets a control


def _wrap(widget, method: str, line: SettingsLine, pending: Callable[[], object]) -> None:
    """Wrap ``widget.<method>`` (where the front end's updates and clicks enter): "running" first, heading after."""
    original = getattr(widget, method)

    def wrapped(*args, **kwargs):
        state = args[0] if method == "set_state" and args and isinstance(args[0], dict) else None
        if method == "set_state" and not (state and SETTING_KEYS & state.keys()):
            return original(*args, **kwargs)  # not a setting (layout, focus...): nothing runs
        line.start(pending(), state)
        try:
            result = original(*args, **kwargs)
        except Exception as e:
            line.failed(e)
            raise
        if line._started is not None:  # no value changed (no observer ran): still head the output
            line.finish()
        return result

    setattr(widget, method, wrapped)
